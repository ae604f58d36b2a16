"""Shell words of one command-line string, in time linear in its length.

A pod's ``command``/``args`` are its author's text: gpusched reads the vLLM command inside a
shell string (``sh -c "ulimit -n 65536 && vllm serve …"``) and must never let that text cost
more than a glance. The standard library's ``shlex`` builds each token by string concatenation
(quadratic: one 400k-character token took 8 CPU s), so this reader matches whole runs with one
regular expression instead and joins the pieces once.

The words are POSIX shell words as ``shlex.shlex(text, posix=True, punctuation_chars=True)``
with ``whitespace_split`` splits them (tested against it): blanks (space, tab, CR, LF) separate
words; a run of ``();<>|&`` is a word of its own; single quotes keep everything literal; inside
double quotes a backslash escapes only ``"`` and ``\\``; outside quotes a backslash escapes any
character; ``''`` is an empty word. One difference, on purpose: ``#`` starts a comment only at
the start of a word, as in a real shell (``shlex`` ends a word at any ``#``). An unterminated quote
or a trailing backslash is not a shell command line: the string is then split on whitespace.

Command-line strings longer than the kernel takes for one argument are never read here: see
:data:`MAX_ARG_BYTES`.
"""

from __future__ import annotations

import re

# The longest single argument execve(2) accepts (Linux MAX_ARG_STRLEN, 32 pages): a longer string
# in command or args can never start, so gpusched refuses the pod instead of reading it.
MAX_ARG_BYTES = 131_072

_BLANKS = " \t\r\n"
_PUNCTUATION = "();<>|&"
# One alternation per kind of run; possessive repeats (Python 3.11) so a failed match never
# backtracks: each character is looked at a bounded number of times.
_RUN = re.compile(
    r"(?P<blank>[ \t\r\n]++)"
    r"|(?P<punct>[();<>|&]++)"
    r"|(?P<word>[^ \t\r\n();<>|&'\"\\#]++)"
    r"|'(?P<single>[^']*+)'"
    r"|\"(?P<double>(?:[^\"\\]|\\.)*+)\""
    r"|\\(?P<escaped>.)"
    r"|(?P<hash>\#)"
    r"|(?P<broken>['\"\\])",
    re.DOTALL,
)
_DOUBLE_ESCAPE = re.compile(r"\\([\"\\])")


def split_shell_words(text: str) -> list[str]:
    """``text`` as shell words (the module docstring's rules), in time linear in ``len(text)``;
    whitespace-split when ``text`` is not a complete shell command line."""
    words: list[str] = []
    pieces: list[str] = []
    started = False  # a word is open (it may be empty: '')
    position, end = 0, len(text)
    while position < end:
        run = _RUN.match(text, position)
        assert run is not None  # the alternation covers every character
        kind = run.lastgroup
        position = run.end()
        if kind == "blank" or kind == "punct":
            if started:
                words.append("".join(pieces))
                pieces, started = [], False
            if kind == "punct":
                words.append(run.group())
            continue
        if kind == "hash" and not started:
            newline = text.find("\n", position)
            position = end if newline < 0 else newline
            continue
        if kind == "broken":
            return text.split()
        started = True
        if kind == "double":
            pieces.append(_DOUBLE_ESCAPE.sub(r"\1", run.group("double")))
        else:
            pieces.append(run.group(kind or 0))
    if started:
        words.append("".join(pieces))
    return words

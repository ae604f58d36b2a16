"""The pydantic-to-our-words translation every validated input uses (gpusched_api.validation)."""

from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, model_validator

from gpusched_api.validation import BOUNDS, RULE, SAID, Say, fail_at, field_path, first_problem, problems


class Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    size: Annotated[StrictInt, Field(ge=1), Say("must be an integer >= 1")]
    score: Annotated[StrictInt, Field(le=100), Say("must be at most 100", kinds=BOUNDS)] = 0
    kind: Annotated[Literal["a"] | Annotated[StrictInt, Field(gt=0)], Say("must be 'a' or a count", whole=True)] = "a"

    @model_validator(mode="after")
    def _even(self) -> "Item":
        if self.size % 2:
            raise fail_at(("size",), f"{self.size} is odd", self.size)
        return self


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: Annotated[list[Item], Say("must be a list")]
    by_name: dict[str, Item] | None = Field(None, alias="byName")


@pytest.mark.parametrize(("loc", "root", "path"), [
    ((), "", ""),
    ((), "fleet", "fleet"),
    (("gpus", 2, "memoryMiB"), "", "gpus[2].memoryMiB"),
    (("scorePlugins", 1, "weight"), "profile", "profile.scorePlugins[1].weight"),
    (("nvlinkIslands", 0, 1), "", "nvlinkIslands[0][1]"),
], ids=["empty", "root-only", "nested", "with-root", "list-in-list"])
def test_field_path(loc, root, path) -> None:
    assert field_path(loc, root) == path


@pytest.mark.parametrize(("raw", "loc", "kind", "message", "value"), [
    ({"items": {}}, ("items",), SAID, "must be a list", {}),
    ({}, ("items",), SAID, "must be a list", None),
    ({"items": [{"size": 2}, {"size": 0}]}, ("items", 1, "size"), SAID, "must be an integer >= 1", 0),
    ({"items": [{}]}, ("items", 0, "size"), SAID, "must be an integer >= 1", None),
    ({"items": [{"size": 2, "score": 101}]}, ("items", 0, "score"), SAID, "must be at most 100", 101),
    ({"items": [{"size": 2, "score": "1"}]}, ("items", 0, "score"), "int_type", "Input should be a valid integer", "1"),
    ({"items": [{"size": 2, "kind": 0}]}, ("items", 0, "kind"), SAID, "must be 'a' or a count", 0),
    ({"items": [{"size": 3}]}, ("items", 0, "size"), RULE, "3 is odd", 3),
    ({"items": [], "byName": {"x": {"size": True}}}, ("byName", "x", "size"), SAID, "must be an integer >= 1", True),
    ({"items": [], "byName": {7: {"size": 2}}}, ("byName", "7"), "string_type", "Input should be a valid string", 7),
], ids=["said-container", "missing-takes-its-say", "said-in-list", "missing-in-list", "said-only-for-bounds",
        "other-kind-keeps-its-own", "whole-union", "rule-is-prefixed", "inside-dict", "dict-key-is-a-name"])
def test_problems_carry_our_sentence_and_the_value(raw, loc, kind, message, value) -> None:
    with pytest.raises(ValidationError) as info:
        Doc.model_validate(raw)
    problem = problems(info.value, Doc)[0]
    assert (problem.loc, problem.kind, problem.message, problem.value) == (loc, kind, message, value)


@pytest.mark.parametrize(("raw", "loc", "known"), [
    ({"items": [], "extra": 1}, ("extra",), ("items", "byName")),
    ({"items": [{"size": 2, "sise": 1}]}, ("items", 0, "sise"), ("size", "score", "kind")),
    ({"items": [], "byName": {"x": {"size": 2, "y": 0}}}, ("byName", "x", "y"), ("size", "score", "kind")),
], ids=["top", "in-list", "in-dict"])
def test_unknown_keys_list_what_their_model_knows(raw, loc, known) -> None:
    with pytest.raises(ValidationError) as info:
        Doc.model_validate(raw)
    problem = problems(info.value, Doc)[0]
    assert (problem.loc, problem.kind, problem.known) == (loc, "extra_forbidden", known)
    assert problem.path("doc", parent=True) == field_path(loc[:-1], "doc")


@pytest.mark.parametrize(("raw", "loc"), [
    ({"items": [{"sise": 2}]}, ("items", 0, "sise")),
    ({"items": [{"sise": 2}], "extra": 1}, ("extra",)),
    ({"items": [{"size": 0}]}, ("items", 0, "size")),
], ids=["misspelt-key-over-missing-field", "outermost-unknown-key", "no-unknown-key"])
def test_first_problem_prefers_the_unknown_key(raw, loc) -> None:
    with pytest.raises(ValidationError) as info:
        Doc.model_validate(raw)
    assert first_problem(info.value, Doc).loc == loc

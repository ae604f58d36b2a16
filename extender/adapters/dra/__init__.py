"""DRA at the edge: the slice, claim and template watches decoded into the DRA state (``feeds``,
re-exported here), and the admission webhook's template creator and HTTPS listener
(``templates``: imported by its own name, it needs the Kubernetes client and uvicorn)."""

from extender.adapters.dra.feeds import (
    ClaimFeed,
    DraFeed,
    SliceFeed,
    TemplateFeed,
    decode_claim,
    decode_requests,
    decode_slice,
    decode_template,
)

__all__ = ["ClaimFeed", "DraFeed", "SliceFeed", "TemplateFeed", "decode_claim", "decode_requests", "decode_slice",
           "decode_template"]

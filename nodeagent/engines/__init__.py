"""vLLM engines on this node: discovery from pod annotations, scraping and parsing ``/metrics``."""

from gpusched_api.names import METRICS_PORT_ANNOTATION
from nodeagent.engines.discovery import Discovery, EngineTarget, discover_engines
from nodeagent.engines.metrics import EngineSample, parse_engine_metrics
from nodeagent.engines.scrape import scrape_engine, scrape_url

__all__ = [
    "METRICS_PORT_ANNOTATION", "Discovery", "EngineSample", "EngineTarget", "discover_engines",
    "parse_engine_metrics", "scrape_engine", "scrape_url",
]

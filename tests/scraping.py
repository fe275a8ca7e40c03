"""Scraping a live ``/metrics`` endpoint in tests, parsed with prometheus_client's parser."""

from __future__ import annotations

import urllib.request
from typing import Any, Optional

import gevent
from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[str, Any]:
    """GET ``url`` from a thread of the hub's pool (the hub goes on serving it), parsed with
    prometheus_client's parser: {family name: family}."""
    def get() -> str:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.read().decode("utf-8")
    text = gevent.get_hub().threadpool.apply(get)
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict[str, Any], family_name: str, sample: Optional[str] = None, /,
          **labels: str) -> float:
    """The value of the one sample of ``family_name`` (sample name ``sample``) with ``labels``."""
    family = families[family_name]
    found = [s.value for s in family.samples
             if (sample is None or s.name == sample)
             and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (family_name, labels, family.samples)
    return found[0]

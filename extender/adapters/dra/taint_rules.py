"""The DeviceTaintRules gpusched manages (``service.dra.device_taints``), at the apiserver."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from extender.service.dra.device_taints import MANAGED_BY, RULE_PREFIX


class KubeTaintRules:
    """``service.dra.device_taints.TaintRules`` over ``resource.k8s.io/v1`` DeviceTaintRules, each call
    with a timeout; creating one that exists or deleting one that is gone is no error."""

    def __init__(self, api: Any, request_timeout_s: float = 10.0) -> None:
        self._resource = client.ResourceV1Api(api)
        self._timeout = request_timeout_s

    def names(self) -> set[str]:
        selector = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
        response: Any = self._resource.list_device_taint_rule(label_selector=selector, _preload_content=False,
                                                              _request_timeout=self._timeout)
        found = json.loads(response.data)
        names = {str((item.get("metadata") or {}).get("name") or "") for item in found.get("items") or []}
        return {n for n in names if n.startswith(RULE_PREFIX)}

    def create(self, rule: Mapping[str, Any]) -> None:
        try:
            self._resource.create_device_taint_rule(cast(Any, dict(rule)), _preload_content=False,
                                                    _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def delete(self, name: str) -> None:
        try:
            self._resource.delete_device_taint_rule(name, _preload_content=False, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise

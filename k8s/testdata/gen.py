"""Writes the ExtenderArgs and PodList files of k8s/extender_test.go.

They are in the shape kube-scheduler's HTTPExtender sends (pkg/scheduler/extender.go: ExtenderArgs{Pod, Nodes}
marshalled as JSON when nodeCacheCapable is false) and `kubectl get pods -A -o json` lists; node labels are
those GPU feature discovery sets on an H100 node (NVIDIA/k8s-device-plugin internal/lm/resource.go @ aaccdfd2:
product, count, memory in MiB, replicas, family). Not recorded from a live cluster. Run: python3 gen.py
"""
import json


def node(name, labels):
    return {"metadata": {"name": name, "labels": dict({"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}, **labels)},
            "status": {"allocatable": {"cpu": "96", "memory": "1056Gi", "pods": "110"}}}


def h100(n):
    return {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": str(n), "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.family": "hopper"}


nodes = [node("gpu-a", h100(2)), node("gpu-b", h100(1)), node("gpu-c", h100(1)), node("cpu-1", {}),
         node("gpu-mig", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/gpu.count": "7"})]
W = {
    "gpt2-xl-full": "train: {model: gpt2-xl, micro-batch: 4, seq: 1024, precision: amp-bf16, checkpoint: full}",
    "chat-llama3-8b": "serve: {model: llama-3-8b, concurrency: 32, context: 2048, gen-tokens: 512}",
    "chat-qwen": "serve: {model: qwen2.5-7b, concurrency: 64, context: 1024, gen-tokens: 256}",
}


def pod(name, w, node=None, gpu=None, ns="team-a"):
    ann = {}
    if w:
        ann["memplan.io/workload"] = W.get(w, w)
    if gpu is not None:
        ann["memplan.io/gpu"] = str(gpu)
    c = {"name": "main", "image": "ghcr.io/example/job:1", "resources": {}}
    p = {"metadata": {"name": name, "namespace": ns, "uid": "uid-" + name, "annotations": ann},
         "spec": {"schedulerName": "default-scheduler", "containers": [c]},
         "status": {"phase": "Pending"}}
    if node:
        p["spec"]["nodeName"] = node
        p["status"]["phase"] = "Running"
    return p


pods = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "91234"}, "items": [
    pod("xl-1", "gpt2-xl-full", "gpu-a", 0), pod("chat-1", "chat-llama3-8b", "gpu-a", 0), pod("qwen-1", "chat-qwen", "gpu-a", 1),
    pod("xl-2", "gpt2-xl-full", "gpu-b"), pod("xl-3", "gpt2-xl-full", "gpu-b"),
    pod("chat-2", "chat-llama3-8b", "gpu-c"),
    pod("done-1", "gpt2-xl-full", "gpu-c"),
]}
pods["items"][-1]["status"]["phase"] = "Succeeded"
json.dump(pods, open("pods.json", "w"), indent=1)


def args(p):
    return {"Pod": p, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}


json.dump(args(pod("xl-new", "gpt2-xl-full")), open("args-xl.json", "w"), indent=1)
json.dump(args(pod("plain", None)), open("args-plain.json", "w"), indent=1)
json.dump(args(pod("bad", "train: {model: gpt2-xl, micro-batch: four}")), open("args-bad.json", "w"), indent=1)
json.dump(args(pod("big", "train: {model: llama-2-13b, micro-batch: 8, seq: 4096, precision: amp-bf16}")), open("args-big.json", "w"), indent=1)

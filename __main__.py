"""twinspark: two (or more) DGX Sparks as one self-healing vLLM endpoint.

Composition root only: validate the config, build the components per node, export the
outputs contract. What each step does lives in components/.
"""

import pulumi
import pulumi_random as random

from components.client_outputs import (
    endpoint_base,
    endpoint_url,
    render_claude_code_env,
    render_codex_config,
    render_codex_model_catalog,
)
from components.config import NAMESPACE, load_stack_config
from components.fabric_check import FabricCheck
from components.host_prep import HostPrep
from components.launch_bundle import LaunchBundle
from components.model_weights import ModelWeights
from components.nccl_check import NcclCheck
from components.readiness import Readiness
from components.serving_cluster import NodeServingInputs, ServingCluster
from components.serving_image import ServingImage, write_pinned_known_hosts

cfg = load_stack_config()
secrets = pulumi.Config(NAMESPACE)
api_key = secrets.get_secret("apiKey") or random.RandomPassword("api-key", length=48, special=False).result
hf_token = secrets.get_secret("hfToken")

host_preps = {n.name: HostPrep(f"{n.name}-hostprep", cfg, n) for n in cfg.nodes}
host_prep_hashes = [hp.content_hash for hp in host_preps.values()]
all_host_prep = pulumi.ResourceOptions(depends_on=list(host_preps.values()))
fabric_checks = {n.name: FabricCheck(f"{n.name}-fabric", cfg, n, host_prep_hashes, opts=all_host_prep) for n in cfg.nodes}
after_fabric = pulumi.ResourceOptions(depends_on=list(fabric_checks.values()))
weights = ModelWeights("weights", cfg, hf_token, opts=after_fabric)
known_hosts = write_pinned_known_hosts(cfg)
images = {n.name: ServingImage(f"{n.name}-image", cfg, n, known_hosts, opts=after_fabric) for n in cfg.nodes}
bundles = {n.name: LaunchBundle(f"{n.name}-bundle", cfg, n, api_key, opts=after_fabric) for n in cfg.nodes}
nccl_checks = (
    [
        NcclCheck(
            "nccl",
            cfg,
            {name: image.image_id for name, image in images.items()},
            host_prep_hashes,
            opts=pulumi.ResourceOptions(depends_on=[*images.values(), *bundles.values()]),
        )
    ]
    if cfg.fabric.min_bus_bandwidth_gbps > 0  # 0 switches the check off
    else []
)
cluster = ServingCluster(
    "serving",
    cfg,
    [
        NodeServingInputs(
            node=n,
            provider=images[n.name].provider,
            image_id=images[n.name].image_id,
            bundle_hash=bundles[n.name].content_hash,
            ready_after=[bundles[n.name], weights, *nccl_checks],
        )
        for n in cfg.nodes
    ],
)
Readiness("readiness", cfg, api_key, cluster.head)

pulumi.export("endpoint", endpoint_url(cfg))
pulumi.export("model", cfg.model.served_name)
pulumi.export("apiKey", pulumi.Output.secret(api_key))
pulumi.export("healthUrl", endpoint_base(cfg) + "/health")
pulumi.export("metricsUrl", endpoint_base(cfg) + "/metrics")
pulumi.export("codexConfig", render_codex_config(cfg))
pulumi.export("codexModelCatalog", render_codex_model_catalog(cfg))
pulumi.export("claudeCodeEnv", pulumi.Output.secret(api_key).apply(lambda key: render_claude_code_env(cfg, key)))
pulumi.export("nodes", [n.model_dump(by_alias=True, include={"name", "role", "host", "rails"}) for n in cfg.nodes])

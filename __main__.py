"""twinspark: two (or more) DGX Sparks as one self-healing vLLM endpoint.

Composition root only: validate the config, give each component the small set of facts it
needs, export the outputs contract. What each step does lives in components/.
"""

from dataclasses import replace

import pulumi
import pulumi_random as random

from components import client_outputs as client
from components.box_recovery import BoxRecovery, box_recovery_args, release_argv
from components.config import Topology, load_secrets, load_stack_config, resolve_node_addresses
from components.fabric_check import FabricCheck, FabricCheckArgs, RailProbe, fabric_check_args
from components.firewall import firewall_policy
from components.host_prep import HostPrep, HostPrepArgs
from components.launch_bundle import LaunchBundle, LaunchBundleArgs, VllmServe
from components.model_weights import CopySource, ModelWeights, ModelWeightsArgs, NodeAccess, memory_fit_args
from components.nccl_check import NcclCheck, NcclCheckArgs, NcclRank, guard_rank_flags, nccl_pairs
from components.observability import Observability, ObservabilityArgs, ObservedAccess, alert_receivers
from components.observability_files import plan_from_config
from components.platform_facts import NodeFacts, PlatformFacts, PlatformFactsArgs
from components.readiness import Readiness, ReadinessArgs
from components.remote import node_installation
from components.renames import alias_renamed_nodes
from components.serving_guard import ServingGuard, ServingGuardArgs
from components.fabric_requalify import FabricRequalify, requalify_args
from components.serving_cluster import NodeServingArgs, ServingCluster, ServingClusterArgs, require_engine_support
from components.serving_image import BaseImagePin, BaseImagePinArgs, ServingImage, ServingImageArgs, ShipFrom
from components.ssh_access import resolve_ssh_access

require_engine_support()
cfg = load_stack_config()
for warning in cfg.warnings:  # allowed, said out loud
    pulumi.log.warn(warning)
pulumi.runtime.register_stack_transformation(alias_renamed_nodes(cfg.nodes))  # nodes[i].formerName
addresses = resolve_node_addresses(cfg.nodes)  # names, for the firewall: resolved before any resource
topology = Topology(cfg, addresses)  # rail peers, Ray's addresses, NCCL's ring env, the copy's rails
ssh = resolve_ssh_access(cfg)  # key, agent, host keys: checked before any resource exists
secrets = load_secrets(hub_endpoint=cfg.model.hub_endpoint)  # the HF token goes only over https
receivers = alert_receivers(cfg.observability, secrets)  # Slack, ntfy, email, webhook: a half-set one refused here
# an Input[str]: mypy types Output.secret(<an Output[str]>) as Output[Never]
api_key: pulumi.Input[str] = secrets["apiKey"] or random.RandomPassword("api-key", length=48, special=False).result
hf_token = secrets["hfToken"]
# Generated once and kept in the state (secret): Ray's cluster token, and the key that makes
# the containers' bundle labels say nothing about the secrets in the bundle. The token is new
# for every new set of machines: a node taken out keeps serving until the engine deletes its
# containers, after the rest restarted, and would rejoin them (and take a rank) with the old one.
ray_token = random.RandomPassword("ray-token", length=48, special=False, keepers={"members": cfg.members}).result
label_key = random.RandomPassword("bundle-label-key", length=32, special=False).result
conns = {n.name: ssh.connection(n) for n in cfg.nodes}
# each node as installed: pinning a reinstalled node's new host key makes its image, containers
# and copy of the weights again (its own steps re-run by themselves)
installations = {n.name: node_installation(n.name, conns[n.name]) for n in cfg.nodes}
head = cfg.head

host_preps = {
    n.name: HostPrep(
        f"{n.name}-hostprep",
        HostPrepArgs(node=n, connection=conns[n.name], mtu=cfg.fabric.mtu,
                     firewall=firewall_policy(n, topology),
                     gpu_clock_cap_mhz=cfg.serving.gpu_clock_cap_mhz,
                     cotenant_memory_percent=cfg.node_memory_budget(n).cotenant_percent),
    )
    for n in cfg.nodes
}
host_prep_hashes = [hp.content_hash for hp in host_preps.values()]
fabric_args = {
    n.name: FabricCheckArgs(
        node_name=n.name,
        connection=conns[n.name],
        mtu=cfg.fabric.mtu,
        link_speed_mbps=cfg.fabric.link_speed_mbps,
        rails=[RailProbe(r.iface, r.hca, topology.peers_on_rail(n, i)) for i, r in enumerate(n.rails)],
        far_ends=topology.far_ends(n),
        host_prep_hashes=host_prep_hashes,
    )
    for n in cfg.nodes
}
fabric_checks = [FabricCheck(f"{name}-fabric", args, opts=pulumi.ResourceOptions(depends_on=list(host_preps.values())))
                 for name, args in fabric_args.items()]
after_fabric = pulumi.ResourceOptions(depends_on=fabric_checks)

# one digest for every node's FROM and the weight download, resolved once on the head when serving.image is a tag
base_image = BaseImagePin("image-pin", BaseImagePinArgs(image=cfg.serving.image, platform=cfg.serving.platform,
                                                     connection=conns[head.name]),
                          opts=after_fabric)
access = {n.name: NodeAccess(n.name, conns[n.name], topology.copy_rails(n) if n.role == "worker" else (),
                             installations[n.name])
          for n in cfg.nodes}


def serving_image(n, ship_from=None) -> ServingImage:
    return ServingImage(
        f"{n.name}-image",
        ServingImageArgs(
            node_name=n.name,
            docker_host=ssh.docker_host(n),
            ssh_opts=ssh.docker_ssh_opts(n),
            base_image=base_image.reference,
            apt_packages=cfg.serving.apt_packages,
            platform=cfg.serving.platform,
            installation=installations[n.name],
            ship_from=ship_from,
        ),
        opts=after_fabric,
    )


# one serving image for the cluster: built on the head, shipped to each worker over the rail (with
# the weight copy's sync key: its authorization opens for the ships too)
images = {head.name: serving_image(head)}
ships = {w.name: ShipFrom(head_name=head.name, head_connection=conns[head.name], image_name=images[head.name].image_name,
                          image_id=images[head.name].image_id, to=f"{cfg.ssh.user}@{access[w.name].copy_ip}")
         for w in cfg.workers}
relays = {name: CopySource(access[source], rails) for name, (source, rails) in topology.weight_relays().items()}
weights = ModelWeights(
    "weights",
    ModelWeightsArgs(
        repo=cfg.model.repo,
        revision=cfg.model_revision,
        dir=cfg.model.dir,
        downloader_image=base_image.reference,
        ssh_user=cfg.ssh.user,
        head=access[head.name],
        workers=[access[w.name] for w in cfg.workers],
        hf_token=hf_token,
        tensor_parallel_size=cfg.tensor_parallel_size,
        pipeline_parallel_size=cfg.pipeline_parallel_size,
        gpu_memory_utilization=cfg.serving.gpu_memory_utilization,
        hub_endpoint=cfg.model.hub_endpoint,
        memory_fit=memory_fit_args(cfg.serving),
        relays=relays,
        copy_after=topology.weight_copy_queue(),
        image_ships={name: ship.run(name) for name, ship in ships.items()},
    ),
    opts=after_fabric,
)
for w in cfg.workers:
    images[w.name] = serving_image(w, replace(ships[w.name], peer_trust=weights.peer_trust[w.name]))
weights.revoke_after({w.name: images[w.name].ship for w in cfg.workers})  # the sync keys' steps done: keys taken back
# the platform gate: every node's facts, judged before the NCCL check and the containers
platform = PlatformFacts(
    "platform",
    PlatformFactsArgs(
        nodes=[NodeFacts(n.name, conns[n.name], images[n.name].image_id, built_here=n.role == "head")
               for n in cfg.nodes],
        base_image=base_image.reference,
        acknowledged=cfg.platform.acknowledge,
    ),
)
gated_image = {n.name: platform.gated(images[n.name].image_id) for n in cfg.nodes}
vllm = VllmServe(serving=cfg.serving, model=cfg.model, tensor_parallel_size=cfg.tensor_parallel_size,
                 pipeline_parallel_size=cfg.pipeline_parallel_size)
bundles = {
    n.name: LaunchBundle(
        f"{n.name}-bundle",
        LaunchBundleArgs(
            node=n,
            connection=conns[n.name],
            vllm=vllm,
            fabric=topology.node_fabric(n),
            ray_token=ray_token,
            label_key=label_key,
            api_key=api_key if n.role == "head" else None,
        ),
        opts=after_fabric,
    )
    for n in cfg.nodes
}
nccl_args = NcclCheckArgs(
    ranks=[
        NcclRank(n.name, conns[n.name], gated_image[n.name], bundles[n.name].env_hash)
        for n in [head, *cfg.workers]
    ],
    master_ip=topology.head_ray_ip,
    min_bus_bandwidth_gbps=cfg.fabric.min_bus_bandwidth_gbps,
    pairs=nccl_pairs(topology),  # three nodes or more: each link first
    join_timeout_s=cfg.fabric.nccl_join_timeout_seconds,
)
nccl = NcclCheck("nccl", nccl_args, opts=pulumi.ResourceOptions(depends_on=[*images.values(), *bundles.values()]))
cluster = ServingCluster(
    "serving",
    ServingClusterArgs(
        nodes=[
            NodeServingArgs(
                node_name=n.name,
                role=n.role,
                provider=images[n.name].provider,
                image_id=gated_image[n.name],
                bundle_hash=bundles[n.name].content_hash,
                ready_after=[bundles[n.name], weights, nccl],
                installation=installations[n.name],
                gateway_hash=bundles[n.name].gateway_hash,
                executor=cfg.serving.executor,
            )
            for n in cfg.nodes
        ],
        model_dir=cfg.model.dir,
        model_container_dir=cfg.model.container_dir,
    ),
)
if cfg.serving.guard.enabled:  # canary, wedge and crash-loop guard, on the head's host
    # what the guard runs when the fabric fails while serving: every node's fabric check and NCCL rank
    requalify = FabricRequalify(
        "requalify",
        requalify_args(cfg, topology, conns, ssh.host_keys,
                       fabric_flags={name: fabric_check_args(args) for name, args in fabric_args.items()},
                       nccl_flags={r.name: guard_rank_flags(nccl_args, r.name) for r in nccl_args.ranks},
                       release={n.name: release_argv(n.name) for n in cfg.nodes}),
        opts=pulumi.ResourceOptions(depends_on=[nccl]))
    ServingGuard(
        f"{head.name}-guard",
        ServingGuardArgs(
            head_name=head.name,
            connection=conns[head.name],
            port=cfg.serving.port,
            node_names=[n.name for n in cfg.nodes],
            config=cfg.serving.guard,
            tool_parser=cfg.serving.recipe_spec.canary_tool_parser,
            rails=[(r.iface, r.hca) for r in head.rails],
            rail_speed_mbps=cfg.fabric.link_speed_mbps,
            rail_mtu=cfg.fabric.mtu,
        ),
        # installed once the container it watches exists, and the checks it re-runs
        opts=pulumi.ResourceOptions(depends_on=[cluster.head, cluster.gateway, requalify]),
    )
# every node's recorder (an unclean boot explained, and held out of serving until re-qualified) and, where a
# node has a `power` plug, the watch on the node after it that power-cycles it when it stops answering
BoxRecovery("recovery", box_recovery_args(cfg, topology, conns),
            opts=pulumi.ResourceOptions(depends_on=list(host_preps.values())))
Readiness(
    "readiness",
    ReadinessArgs(
        head_name=head.name,
        connection=conns[head.name],
        port=cfg.serving.port,
        served_name=cfg.model.served_name,
        timeout_minutes=cfg.serving.readiness_timeout_minutes,
        api_key=api_key,
        serving=[cluster.head, cluster.gateway],
    ),
)

if cfg.observability.enabled:  # Prometheus, Grafana (and Alertmanager) on the head, exporters on every node
    grafana_password = secrets["grafanaAdminPassword"] or random.RandomPassword(
        "grafana-admin-password", length=32, special=False).result
    Observability(
        "observability",
        ObservabilityArgs(
            plan=plan_from_config(cfg, alertmanager=receivers is not None, topology=topology),
            access={n.name: ObservedAccess(n.name, conns[n.name], images[n.name].provider, installations[n.name])
                    for n in cfg.nodes},
            grafana_admin_password=grafana_password,
            alert_receivers=receivers,
            label_key=label_key,
            pin_image=lambda capability, image: BaseImagePin(
                f"observability-{capability}-image-pin",
                BaseImagePinArgs(image=image, platform=cfg.serving.platform, connection=conns[head.name]),
                opts=after_fabric).reference,
        ),
        opts=after_fabric,  # the exporters bind the Ray addresses (direct, switch: the first rail)
    )
    pulumi.export("grafanaUrl", client.grafana_url(cfg))
    pulumi.export("grafanaAdminPassword", pulumi.Output.secret(grafana_password))
    pulumi.export("prometheusUrl", client.prometheus_url())
    pulumi.export("prometheusTunnel", client.prometheus_tunnel(cfg))

pulumi.export("endpoint", client.endpoint_url(cfg))
pulumi.export("model", cfg.model.served_name)
pulumi.export("recipe", cfg.serving.recipe)
pulumi.export("executor", cfg.serving.executor)  # ops status: Ray's membership or mp's node ranks
pulumi.export("memoryFit", weights.memory_fit)  # the estimate before the load (model-shape.py check)
pulumi.export("modelRevision", weights.revision)  # the commit every node holds (model.revision or resolved once)
pulumi.export("modelDir", cfg.model.dir)  # where every node holds it (ops verify-weights)
pulumi.export("apiKey", pulumi.Output.secret(api_key))
pulumi.export("healthUrl", client.endpoint_base(cfg) + "/health")
pulumi.export("metricsUrl", client.endpoint_base(cfg) + "/metrics")
pulumi.export("codexConfig", client.render_codex_config(cfg))
pulumi.export("codexModelCatalog", client.render_codex_model_catalog(cfg))
pulumi.export("claudeCodeEnv", pulumi.Output.secret(api_key).apply(lambda key: client.render_claude_code_env(cfg, key)))
pulumi.export("claudeCodeSettings", client.render_claude_code_settings())
pulumi.export("openaiEnv", pulumi.Output.secret(api_key).apply(lambda key: client.render_openai_env(cfg, key)))
pulumi.export("nodes", client.nodes_output(cfg, ssh.host_keys, topology))
pulumi.export("fabric", client.fabric_output(cfg))
pulumi.export("sshUser", cfg.ssh.user)
pulumi.export("servingImage", base_image.output())
# each node's launch bundle, as its containers' label holds it (keyed: says nothing of the secrets in it):
# what `ops upgrade` checks its rollback against
pulumi.export("launchBundles", pulumi.Output.all(*(b.content_hash for b in bundles.values())).apply(
    lambda hashes: dict(zip(bundles, hashes))))
pulumi.export("platform", platform.facts.apply(
    lambda facts: {"facts": facts, "acknowledge": list(cfg.platform.acknowledge)}))

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
from components.lanes import LaneSwap, LaneSwapArgs, lane_addresses, lane_parts, serving_order
from components.launch_bundle import LaunchBundle, LaunchBundleArgs, VllmServe
from components.model_weights import CopySource, ModelWeights, ModelWeightsArgs, NodeAccess, memory_fit_args
from components.nccl_check import NcclCheck, NcclCheckArgs, NcclRank, guard_rank_flags, nccl_pairs
from components.observability import Observability, ObservabilityArgs, ObservedAccess, alert_receivers
from components.observability_files import plan_from_config, scraped_over_the_rail
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
secrets = load_secrets(hub_endpoints=cfg.hub_endpoints)  # the HF token goes only over https
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
# serving.kvTier: PYTHONHASHSEED (0 to 2^32 - 1: four random bytes as an integer), which names the tier's blocks
# (core/kv_tier.py), the same across restarts
kv_tier_seed = random.RandomId("kv-tier-hash-seed", byte_length=4, opts=pulumi.ResourceOptions(
    additional_secret_outputs=["dec"])).dec if any(lane.serving.kv_tier for lane in cfg.served_lanes) else None
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
access: dict[str, NodeAccess] = {}
images: dict[str, ServingImage] = {}
weights: dict[str, ModelWeights] = {}  # by lane
readiness: list[Readiness] = []
# one lane: the stack itself, every resource named as before; several: each a one-lane stack of its own
lanes = lane_parts(cfg, addresses)


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


for part in lanes:  # each lane's image and weights: on its head, copied to its workers
    view, vtopology = part.view, part.topology
    vhead = view.head
    access.update({n.name: NodeAccess(n.name, conns[n.name], vtopology.copy_rails(n) if n.role == "worker" else (),
                                      installations[n.name])
                   for n in view.nodes})
    # one serving image for the lane: built on its head, shipped to each worker over the rail (with
    # the weight copy's sync key: its authorization opens for the ships too)
    images[vhead.name] = serving_image(vhead)
    ships = {w.name: ShipFrom(head_name=vhead.name, head_connection=conns[vhead.name],
                              image_name=images[vhead.name].image_name, image_id=images[vhead.name].image_id,
                              to=f"{cfg.ssh.user}@{access[w.name].copy_ip}")
             for w in view.workers}
    relays = {name: CopySource(access[source], rails) for name, (source, rails) in vtopology.weight_relays().items()}
    weights[part.lane.name] = ModelWeights(
        part.name("weights"),
        ModelWeightsArgs(
            repo=view.model.repo,
            revision=view.model_revision,
            dir=view.model.dir,
            downloader_image=base_image.reference,
            ssh_user=cfg.ssh.user,
            head=access[vhead.name],
            workers=[access[w.name] for w in view.workers],
            hf_token=hf_token,
            tensor_parallel_size=view.tensor_parallel_size,
            pipeline_parallel_size=view.pipeline_parallel_size,
            gpu_memory_utilization=view.serving.gpu_memory_utilization,
            hub_endpoint=view.model.hub_endpoint,
            memory_fit=memory_fit_args(view.serving),
            relays=relays,
            copy_after=vtopology.weight_copy_queue(),
            image_ships={name: ship.run(name) for name, ship in ships.items()},
        ),
        opts=after_fabric,
    )
    for w in view.workers:
        images[w.name] = serving_image(w, replace(ships[w.name], peer_trust=weights[part.lane.name].peer_trust[w.name]))
    weights[part.lane.name].revoke_after({w.name: images[w.name].ship for w in view.workers})  # the sync keys' steps done
# the platform gate: every node's facts, judged before the NCCL check and the containers
lane_heads = {part.view.head.name for part in lanes}
platform = PlatformFacts(
    "platform",
    PlatformFactsArgs(
        nodes=[NodeFacts(n.name, conns[n.name], images[n.name].image_id, built_here=n.name in lane_heads)
               for n in cfg.nodes],
        base_image=base_image.reference,
        acknowledged=cfg.platform.acknowledge,
        engines=[[n.name for n in part.view.nodes] for part in lanes],
    ),
)
gated_image = {n.name: platform.gated(images[n.name].image_id) for n in cfg.nodes}
bundles: dict[str, LaunchBundle] = {}
cluster = ServingCluster("serving")  # every lane's containers: a node keeps its container's resource whatever it serves
for part in serving_order(lanes):  # each lane's engine: its bundles, NCCL check, containers, guard and readiness wait
    view, vtopology = part.view, part.topology
    vhead = view.head
    vllm = VllmServe(serving=view.serving, model=view.model, tensor_parallel_size=view.tensor_parallel_size,
                     pipeline_parallel_size=view.pipeline_parallel_size, lane=part.lane.name)
    for n in view.nodes:
        bundles[n.name] = LaunchBundle(
            f"{n.name}-bundle",
            LaunchBundleArgs(
                node=n,
                connection=conns[n.name],
                vllm=vllm,
                fabric=vtopology.node_fabric(n),
                ray_token=ray_token,
                label_key=label_key,
                api_key=api_key if n.role == "head" else None,
                front_port=cfg.serving.port if cfg.several_lanes and n == head else None,
                lane_gateway=cfg.several_lanes,
                metrics_address=scraped_over_the_rail(cfg, topology, n),
                kv_tier_seed=kv_tier_seed if view.serving.kv_tier else None,
            ),
            opts=after_fabric,
        )
    nccl_args = NcclCheckArgs(
        # the head's rank first: rank 0 holds the roll call at master_ip (after a role swap, not nodes[0])
        ranks=[NcclRank(n.name, conns[n.name], gated_image[n.name], bundles[n.name].env_hash)
               for n in [vhead, *view.workers]],
        master_ip=vtopology.head_ray_ip,
        min_bus_bandwidth_gbps=cfg.fabric.min_bus_bandwidth_gbps,
        pairs=nccl_pairs(vtopology),  # three nodes or more: each link first
        join_timeout_s=cfg.fabric.nccl_join_timeout_seconds,
    )
    # a lane on one node beside others has no fabric of its own to check (one stack's one lane keeps its check)
    fabric_used = view.world_size > 1 or not cfg.several_lanes
    checks = [NcclCheck(part.name("nccl"), nccl_args,
                        opts=pulumi.ResourceOptions(depends_on=[*(images[n.name] for n in view.nodes),
                                                                *(bundles[n.name] for n in view.nodes)]))] \
        if fabric_used else []
    # several lanes: the lane's gateway drained before its containers are swapped, opened after
    swap = LaneSwap(part.name("swap"), LaneSwapArgs(
        vhead.name, conns[vhead.name], view.serving.port, cfg.serving.guard.drain_seconds,
        swapped_by=[x for n in view.nodes for x in (gated_image[n.name], bundles[n.name].content_hash)] +
        [bundles[vhead.name].gateway_hash or ""])) if cfg.several_lanes else None
    serving_nodes = {
        n.name: NodeServingArgs(
            node_name=n.name,
            role=n.role,
            provider=images[n.name].provider,
            image_id=gated_image[n.name],
            bundle_hash=bundles[n.name].content_hash,
            ready_after=[bundles[n.name], weights[part.lane.name], *checks, *([swap.drain] if swap else [])],
            installation=installations[n.name],
            gateway_hash=bundles[n.name].gateway_hash,
            executor=view.serving.executor,
        )
        for n in view.nodes
    }
    if vhead == head:
        head_serving = serving_nodes[head.name]
    served = cluster.serve(ServingClusterArgs(nodes=list(serving_nodes.values()), model_dir=view.model.dir,
                                              model_container_dir=view.model.container_dir,
                                              several_lanes=cfg.several_lanes,
                                              stack_head_lane=cfg.several_lanes and vhead == head))
    if cfg.serving.guard.enabled:  # canary, wedge and crash-loop guard, on the lane head's host
        watched: list[pulumi.Resource] = [served.head, served.gateway]
        if fabric_used:
            # what the guard runs when the fabric fails while serving: every node's fabric check and NCCL rank
            watched.append(FabricRequalify(
                part.name("requalify"),
                requalify_args(view, vtopology, conns, ssh.host_keys,
                               fabric_flags={n.name: fabric_check_args(fabric_args[n.name]) for n in view.nodes},
                               nccl_flags={r.name: guard_rank_flags(nccl_args, r.name) for r in nccl_args.ranks},
                               release={n.name: release_argv(n.name) for n in view.nodes}),
                opts=pulumi.ResourceOptions(depends_on=checks)))
        ServingGuard(
            f"{vhead.name}-guard",
            ServingGuardArgs(
                head_name=vhead.name,
                connection=conns[vhead.name],
                port=view.serving.port,
                node_names=[n.name for n in view.nodes],
                config=cfg.serving.guard,
                tool_parser=view.serving.recipe_spec.canary_tool_parser,
                rails=[(r.iface, r.hca) for r in vhead.rails] if fabric_used else [],
                rail_speed_mbps=cfg.fabric.link_speed_mbps,
                rail_mtu=cfg.fabric.mtu,
            ),
            # installed once the container it watches exists, and the checks it re-runs
            opts=pulumi.ResourceOptions(depends_on=watched),
        )
    readiness.append(Readiness(
        part.name("readiness"),
        ReadinessArgs(
            head_name=vhead.name,
            connection=conns[vhead.name],
            port=view.serving.port,
            served_name=view.model.served_name,
            timeout_minutes=cfg.serving.readiness_timeout_minutes,
            api_key=api_key,
            serving=[served.head, served.gateway],
            after=[swap.open_after([served.head, served.gateway])] if swap else [],
            lane_gateway=cfg.several_lanes,
        ),
    ))
if cfg.several_lanes:  # the head's one endpoint: the router, and the stack's gateway in front of it
    cluster.front(head_serving, lane_addresses(cfg, topology), after=readiness)
# every node's recorder (an unclean boot explained, and held out of serving until re-qualified) and, where a
# node has a `power` plug, the watch on the node after it that power-cycles it when it stops answering
BoxRecovery("recovery", box_recovery_args(cfg, topology, conns),
            opts=pulumi.ResourceOptions(depends_on=list(host_preps.values())))

if cfg.observability.enabled:  # Prometheus, Grafana (and Alertmanager) on the head, exporters on every node
    grafana_password = secrets["grafanaAdminPassword"] or random.RandomPassword(
        "grafana-admin-password", length=32, special=False).result
    Observability(
        "observability",
        ObservabilityArgs(
            plan=plan_from_config(cfg, alertmanager=receivers is not None, topology=topology),  # every lane's engine
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

# what clients are told: the head's lane's model (one lane: the stack's) at the stack's one endpoint
client_views = cfg.client_views
first, client_cfg = weights[cfg.head_lane.name], client_views[0]
pulumi.export("endpoint", client.endpoint_url(cfg))
pulumi.export("model", client_cfg.model.served_name)
pulumi.export("recipe", client_cfg.serving.recipe)
pulumi.export("executor", client_cfg.serving.executor)  # ops status: Ray's membership or mp's node ranks
pulumi.export("memoryFit", first.memory_fit)  # the estimate before the load (model-shape.py check)
pulumi.export("modelRevision", first.revision)  # the commit every node holds (model.revision or resolved once)
pulumi.export("modelDir", client_cfg.model.dir)  # where every node holds it (ops verify-weights)
pulumi.export("apiKey", pulumi.Output.secret(api_key))
pulumi.export("healthUrl", client.endpoint_base(cfg) + "/health")
pulumi.export("metricsUrl", client.endpoint_base(cfg) + "/metrics")
pulumi.export("codexConfig", client.render_codex_config(client_views))
pulumi.export("codexModelCatalog", client.render_codex_model_catalog(client_views))
pulumi.export("claudeCodeEnv", pulumi.Output.secret(api_key).apply(lambda key: client.render_claude_code_env(client_views, key)))
pulumi.export("claudeCodeSettings", client.render_claude_code_settings())
pulumi.export("openaiEnv", pulumi.Output.secret(api_key).apply(lambda key: client.render_openai_env(client_cfg, key)))
if cfg.several_lanes:  # each lane as it is served: the day-2 tools' --model, and `preview` naming the lanes it touches
    pulumi.export("lanes", client.lanes_output(cfg, {name: w.revision for name, w in weights.items()}))
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

"""twinspark components: one module per capability (a ComponentResource each), and beside them
their helpers: the config schema (config/), node execution (remote.py), SSH access, the
firewall's and the monitoring's pure renders, the client configs, renames. The rules every layer
shares are core/'s."""

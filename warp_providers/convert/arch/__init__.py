"""One module per checkpoint ``model_type``: its config keys and checks, tensor map, plan.

Each module exposes ``MODEL_TYPE`` and ``load(src, cfg, gen) -> Plan``; the table of
them (and of the aliases) is ``warp_providers.convert.registry``.
"""

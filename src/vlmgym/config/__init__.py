"""The machinery of params.yaml's sections, at the bottom of the house (imports nothing else of vlmgym): `spec`
fields and their validation (spec.py), the sections (sections.py) and the sub-sections they share (subsections.py).

The envs and the modules beneath them import from these modules; everything above the envs imports from
vlmgym.params, which adds the `env` section (vlmgym.envs.registry.EnvParams) and reads params files, looking env
names and the envs' own sections up in the registry.
"""

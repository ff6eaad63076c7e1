"""The machinery of params.yaml's sections, at the bottom of the house (imports nothing else of vlmgym): `spec`
fields and their validation (spec.py), the sections (sections.py) and the sub-sections they share (subsections.py).

The envs and the modules beneath them import from these modules; everything above the envs imports from
vlmgym.params, which adds the `env` section (vlmgym.envs.registry.EnvParams) and reads params files, looking env
names and the envs' own sections up in the registry.
"""

import warnings as _warnings

from vlmgym.config.spec import spec as _spec


def spec(*args, **kwargs):
    """`spec` under the name plug-ins written from older guides import (`from vlmgym.config import spec`); it
    warns and hands on to vlmgym.config.spec.spec. New code imports it from vlmgym.api."""
    _warnings.warn("vlmgym.config.spec as a function is deprecated: import spec from vlmgym.api", DeprecationWarning,
                   stacklevel=2)
    return _spec(*args, **kwargs)

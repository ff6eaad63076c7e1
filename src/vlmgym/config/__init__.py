"""params.yaml's sections and their validation, at the bottom of the house (imports nothing else of vlmgym).

Modules the envs build on import from here; everything else uses vlmgym.params, which also loads the env registry
that validation looks env names up in.
"""

from vlmgym.config.sections import (
    DEFAULT_PARAMS_FILE,
    LORA_TEXT_TARGETS,
    REMAT_DOC,
    SECTIONS,
    DataParams,
    EnvParams,
    EvalParams,
    ExportParams,
    LoRAParams,
    ModelParams,
    PerceptionParams,
    RolloutParams,
    SFTParams,
    ShardParams,
    TrackingParams,
    TrainParams,
    load_all,
    load_section,
    read_yaml,
)
from vlmgym.config.spec import ParamsError, from_dict, spec, to_dict, use_env_catalogue

__all__ = ["DEFAULT_PARAMS_FILE", "LORA_TEXT_TARGETS", "REMAT_DOC", "SECTIONS", "DataParams",
           "EnvParams", "EvalParams", "ExportParams", "LoRAParams", "ModelParams", "ParamsError", "PerceptionParams",
           "RolloutParams",
           "SFTParams", "ShardParams", "TrackingParams", "TrainParams", "from_dict", "load_all", "load_section",
           "read_yaml", "spec", "to_dict", "use_env_catalogue"]

"""Qwen2.5-VL in JAX: a second model family beside `vlmgym.models.qwen3_vl`, sharing its decoder and converter.

Not wired into the pipeline yet. Modules: `config` (from_hf_dict, load_hf_config), `weights` (param_specs,
init_params, abstract_params), `vision` (patch_layout, encode_images: window + full attention), `model`
(forward, prefill, decode_step, rope_index), `processor` (preprocess_images with the hub's 14-pixel patches and
CLIP normalisation), `convert` (hf_to_params, params_to_hf, load_hf_folder, save_hf_folder).
`vlmgym.models.family` picks the family from a checkpoint's config.json.
"""

"""Qwen2.5-VL in JAX: a second model family beside `vlmgym.models.qwen3_vl`, sharing its decoder and converter.

Modules: `config` (from_hf_dict, load_hf_config), `weights` (param_specs, init_params, abstract_params), `vision`
(patch_layout, encode_patches, encode_images: window + full attention), `processor` (the hub's 14-pixel patches, CLIP
normalisation and Instruct chat template), `convert` (hf_to_params, params_to_hf, load_hf_folder, save_hf_folder),
`tiny` (the tiny random model of `model.tiny_family: qwen2_5_vl`). The decoder is `vlmgym.models.qwen3_vl.model`'s,
which runs the Qwen2 decoder as is (q/k/v biases read from the params, no q/k norm, chunked MRoPE from the config, no
DeepStack). `vlmgym.models.family` picks the family from a checkpoint's config.json.
"""

"""Loading models offline: the bundled set by name, any local checkpoint by path, tokenizers,
and the example prompts. The public names are re-exported here from `models`."""

from specscope.core.loading.models import (BUNDLED_DRAFTS, BUNDLED_HEADS, BUNDLED_REAL_DRAFTS,
                                           BUNDLED_REAL_HEADS, CheckpointError,
                                           ExamplePrompt, ModelPair, bundled_available, bundled_head_path, bundled_path, check_tokenizers, example_prompt, example_prompts, load_bundled,
                                           load_model, load_models, load_pair, load_tokenizer, max_positions, models_dir,
                                           prompts_dir, resolve_device, resolve_dtype, resources_dir,
                                           tokenizer_difference, tokenizer_warnings)

__all__ = ["BUNDLED_DRAFTS", "BUNDLED_HEADS", "BUNDLED_REAL_DRAFTS", "BUNDLED_REAL_HEADS", "CheckpointError", "ExamplePrompt", "ModelPair",
           "bundled_available", "bundled_head_path", "bundled_path",
           "check_tokenizers", "example_prompt", "example_prompts", "load_bundled", "load_model", "load_models",
           "load_pair", "load_tokenizer", "max_positions", "models_dir", "prompts_dir", "resolve_device", "resolve_dtype",
           "resources_dir", "tokenizer_difference", "tokenizer_warnings"]

"""Writes the project's SmolLM2 GGUF out in the Hugging Face layout vLLM loads.

Run with the vLLM venv's Python (scripts/install-vllm.sh puts transformers, gguf, accelerate and
safetensors there):

    python scripts/prepare-vllm-model.py GGUF_DIR GGUF_FILE TEMPLATE_CONFIG OUT_DIR

vLLM reads safetensors + config.json, not GGUF. transformers can dequantize the GGUF, but its
`save_pretrained` refuses a GGUF-loaded model, so the state dict is written directly (bf16; the
tied `lm_head.weight` is left out, as Hugging Face checkpoints do). The GGUF's chat template is
not carried over by transformers: the one the project already extracted (TEMPLATE_CONFIG, a
tokenizer_config.json) is set on the tokenizer, so vLLM renders chats exactly as the filter does.
The output directory is written under a temporary name and renamed when complete.
"""

import json
import os
import shutil
import sys


def main() -> None:
    gguf_dir, gguf_file, template_config, out = sys.argv[1:5]
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    part = out + ".part"
    shutil.rmtree(part, ignore_errors=True)
    os.makedirs(part)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file=gguf_file, torch_dtype=torch.bfloat16
    )
    config = AutoConfig.from_pretrained(gguf_dir, gguf_file=gguf_file)
    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict["torch_dtype"] = "bfloat16"
    config_dict["dtype"] = "bfloat16"
    if not config_dict.get("architectures"):  # transformers leaves it empty for GGUF
        config_dict["architectures"] = [type(model).__name__]
    with open(os.path.join(part, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=2)
    state = {
        k: v.to(torch.bfloat16).contiguous()
        for k, v in model.state_dict().items()
        if not (k == "lm_head.weight" and config_dict.get("tie_word_embeddings", True))
    }
    save_file(state, os.path.join(part, "model.safetensors"), metadata={"format": "pt"})
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    with open(template_config) as f:
        extracted = json.load(f)
    tokenizer.chat_template = extracted["chat_template"]
    tokenizer.save_pretrained(part)
    # the special tokens the template and vLLM's stop handling name, as the GGUF gives them
    saved_config = os.path.join(part, "tokenizer_config.json")
    with open(saved_config) as f:
        saved = json.load(f)
    for key in ("bos_token", "eos_token"):
        if key in extracted:
            saved[key] = extracted[key]
    with open(saved_config, "w") as f:
        json.dump(saved, f, indent=2)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(part, out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A usable image-text checkpoint for the CLI and server tests, made at run time from the tiny
gemma3_vision golden (tests/fixtures/golden/gemma3_vision, unpacked by cmake): its config and
weights (copied: a model folder's files must lie in it), plus what a real Gemma 3 checkpoint carries besides them:
  tokenizer.json         WordLevel over the golden's 300 ids, whitespace pre-tokenizer: <pad> 0,
                         <eos> 1, <bos> 2, <unk> 3, <start_of_turn> 4, <end_of_turn> 5, user 6,
                         model 7, w8 .. w296 (the words of a prompt), and the golden's image tokens
                         <start_of_image> 297, <end_of_image> 298, <image_soft_token> 299 as
                         special added tokens
  tokenizer_config.json  bos/eos and Gemma 3's chat template (images as <start_of_image>)
  preprocessor_config.json  Gemma3ImageProcessor at the tiny tower's 64 x 64
  processor_config.json  image_seq_length 16 (the golden's mm_tokens_per_image)
Usage: python3 tests/cli/make_vision_checkpoint.py OUTDIR  (run from the repo root)
"""
import json, os, shutil, sys

GOLDEN = os.path.abspath("tests/fixtures/golden/gemma3_vision")
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for f in ("config.json", "model.safetensors", "generation_config.json"):
    shutil.copyfile(os.path.join(GOLDEN, f), os.path.join(out, f))

special = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 4, "<end_of_turn>": 5,
           "<start_of_image>": 297, "<end_of_image>": 298, "<image_soft_token>": 299}
vocab = dict(special)
vocab["user"] = 6
vocab["model"] = 7
for i in range(8, 297):
    vocab["w%d" % i] = i
added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True} for c, i in sorted(special.items(), key=lambda x: x[1])]
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
       "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
       "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"))

# Gemma 3's chat template (google/gemma-3-4b-it), shortened: no system-message folding
template = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")
json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
           "chat_template": template}, open(os.path.join(out, "tokenizer_config.json"), "w"))
json.dump({"image_processor_type": "Gemma3ImageProcessor", "size": {"height": 64, "width": 64},
           "resample": 2, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
           "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_pan_and_scan": False},
          open(os.path.join(out, "preprocessor_config.json"), "w"))
json.dump({"processor_class": "Gemma3Processor", "image_seq_length": 16},
          open(os.path.join(out, "processor_config.json"), "w"))

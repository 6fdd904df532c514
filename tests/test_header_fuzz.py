"""Fuzz the safetensors header reader with mutations of real headers (a shard of the real
transformers FP8 checkpoint in tests/data, and a tiny bf16 file saved by transformers).

Whatever the mutation, ``read_header`` either raises CheckpointError naming the file or accepts
a file that ``load_file`` then reads completely (and the safetensors library agrees); never
another exception, never a hang. Bounded and derandomized so CI runs it in seconds.
"""

import json
import signal
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from swiglu_fused.weight_packing import safetensors_io as sio

from conftest import DATA

SEEDS = {
    "fp8-shard": (DATA / "tiny-llama-fp8" / "model-00004-of-00004.safetensors").read_bytes(),
}


def _tiny_bf16_file() -> bytes:
    """A real single-file checkpoint of a tiny (hidden 64) LLaMA, saved by transformers."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=32, vocab_size=32, tie_word_embeddings=False)
    with tempfile.TemporaryDirectory() as d:
        tf.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(d)
        return (Path(d) / "model.safetensors").read_bytes()


SEEDS["bf16-model"] = _tiny_bf16_file()


def _split(raw: bytes):
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.sampled_from(["BF16", "F8_E4M3", "F32", "U8", "F4", "bf16", "__metadata__", "lone \udc80 surrogate"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
SMALL = st.integers(-40, 40) | st.sampled_from([2**31, 2**32, 2**63, 2**64, -2**63])


@st.composite
def mutation(draw):
    """One to three edits of a header (as JSON), then optionally of its bytes and the data section."""
    seed = draw(st.sampled_from(sorted(SEEDS)))
    header, data = _split(SEEDS[seed])
    names = sorted(k for k in header if k != "__metadata__")
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(names))
        kind = draw(st.sampled_from(["field", "drop_field", "offset", "dim", "swap_offsets", "rename", "new_tensor",
                                     "drop_tensor", "metadata", "entry"]))
        entry = header.get(name)
        if not isinstance(entry, dict):
            continue
        if kind == "field":
            entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(JSON_VALUES)
        elif kind == "drop_field":
            entry.pop(draw(st.sampled_from(["dtype", "shape", "data_offsets"])), None)
        elif kind == "offset" and isinstance(entry.get("data_offsets"), list) and entry["data_offsets"]:
            i = draw(st.integers(0, len(entry["data_offsets"]) - 1))
            if isinstance(entry["data_offsets"][i], int):
                entry["data_offsets"][i] += draw(SMALL)
        elif kind == "dim" and isinstance(entry.get("shape"), list) and entry["shape"]:
            i = draw(st.integers(0, len(entry["shape"]) - 1))
            entry["shape"][i] = draw(SMALL | st.sampled_from([0, 2**62, True]))
        elif kind == "swap_offsets":
            other = header.get(draw(st.sampled_from(names)))
            if isinstance(other, dict):
                entry["data_offsets"], other["data_offsets"] = other.get("data_offsets"), entry.get("data_offsets")
        elif kind == "rename":
            header[draw(st.text(max_size=12) | st.sampled_from(names + ["__metadata__"]))] = header.pop(name)
        elif kind == "new_tensor":
            header[draw(st.text(max_size=12))] = dict(entry, **draw(st.dictionaries(
                st.sampled_from(["dtype", "shape", "data_offsets"]), JSON_VALUES, max_size=2)))
        elif kind == "drop_tensor":
            header.pop(name, None)
        elif kind == "metadata":
            header["__metadata__"] = draw(JSON_VALUES)
        else:
            header[name] = draw(JSON_VALUES)
    text = json.dumps(header).encode()
    if draw(st.booleans()):  # a byte-level edit of the JSON text: flip, delete or duplicate a span
        i = draw(st.integers(0, len(text) - 1))
        op = draw(st.sampled_from(["flip", "delete", "duplicate"]))
        if op == "flip":
            text = text[:i] + bytes([text[i] ^ draw(st.integers(1, 255))]) + text[i + 1:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 16)):]
        else:
            j = i + draw(st.integers(1, 64))
            text = text[:j] + text[i:j] + text[j:]
    text += b" " * draw(st.sampled_from([0, -len(text) % 8]))
    length = len(text) + draw(st.sampled_from([0, 0, 0, 1, -1, 8, 2**40]))
    tail = draw(st.sampled_from(["keep", "keep", "truncate", "extend"]))
    if tail == "truncate":
        data = data[:draw(st.integers(0, len(data)))]
    elif tail == "extend":
        data += bytes(draw(st.integers(1, 64)))
    return struct.pack("<Q", max(length, 0) % 2**64) + text + data


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang("the header reader hung")


@settings(max_examples=300, deadline=2000, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutation())
def test_mutated_headers_give_a_checkpoint_error_or_a_file_that_loads(blob):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "model.safetensors"
        path.write_bytes(blob)
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(10)
        try:
            try:
                header = sio.read_header(path)
            except sio.CheckpointError as e:
                assert str(e).startswith(str(path)), e
                return
            tensors = sio.load_file(path)  # accepted: it must load, every tensor as the header says
            assert sorted(tensors) == sorted(header.entries)
            for name, t in tensors.items():
                assert t.dtype == header.entries[name].dtype and tuple(t.shape) == header.entries[name].shape
            with safe_open(str(path), framework="pt") as f:  # and the safetensors library agrees
                assert sorted(f.keys()) == sorted(header.entries)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_the_unmutated_seeds_load(seed, tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(SEEDS[seed])
    assert len(sio.load_file(path)) == len(sio.read_header(path).entries) > 3

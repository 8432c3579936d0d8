"""Read EAGLE-3 drafter dirs as SGLang 0.5.23 builds its drafter from them, and report the fields it is built from.

Runs in the SGLang venv (``engines/sglang_venv.sh``) and imports nothing of draftsmith:
``python sglang_config_read.py IN.json OUT.json``. IN: {"target": TARGET_DIR, "dirs": {NAME: DIR}}. OUT:
{NAME: {FIELD: VALUE}} with the fields of ``draftsmith.eval.doctor.engine_reads`` (the layer shape,
``draft_vocab_size``, ``target_hidden_size``, the norm flags and ``feature_layers``), plus ``num_aux_hidden_states``
and ``unloaded`` (the drafter's parameters its ``load_weights`` left unset), or {NAME: {"error": ...}}.

What is SGLang's own code here, run on CPU (``SGLANG_USE_CPU_ENGINE=1``, world size 1 over gloo, as SGLang's layer
tests set it up):
- ``ServerArgs(speculative_algorithm="EAGLE3", speculative_draft_model_path=DIR)`` published for each dir, and
  ``ModelConfig.from_server_args(..., is_draft_model=True)``: the draft's ``config.json`` parsed by SGLang's
  ``get_config`` and draft-model remapping.
- ``models/llama_eagle3.py::LlamaForCausalLMEagle3(hf_config)`` constructed: every field below is read off the built
  modules (embedding and LM head sizes, ``fc``'s input width, the attention and MLP shapes, the decoder stack's length,
  ``input_norm`` / ``fc_norm`` present, ``norm_output``), i.e. as its constructor read the config; then its
  ``load_weights`` on the dir's safetensors (``unloaded``: parameters no tensor reached, a layout it does not read, or
  why it failed).
- the aux layer ids: ``spec_aux_hidden_state._resolve_eagle_aux_hidden_state`` (the target worker's reading of the
  draft config) and ``attention_backend_setup.configure_aux_hidden_state_capture`` on a real
  ``models/llama.py::LlamaForCausalLM`` built from TARGET_DIR (``set_eagle3_layers_to_capture``), whose
  ``model.layers_to_capture`` are reported. Still transcribed, not run: that layer i's capture is its *input*
  (``LlamaDecoderLayer.forward``'s ``attn_boundary.prepare(capture=...)``), i.e. HF ``hidden_states[i]``: no forward
  pass runs here (it needs SGLang's attention backends and a ForwardBatch).
- ``norm_before_residual`` is not an attribute of SGLang's EAGLE-3: reported False (the table's "not read").

Stubbed, never SGLang's parsing code: ``triton`` and ``sgl_kernel`` (GPU / CPU kernel libraries imported at module
level by SGLang's kernel and layer modules; triton's CPU-less wheel is ~1 GB, sgl_kernel's PyPI build is CUDA's) and
``torchvision`` (imported by SGLang's multimodal processors when ``sglang.srt.configs`` loads; PyPI's wheels are
CUDA builds that cannot load beside the CPU torch). Each is a module whose every attribute is an inert class (a
decorator returns what it decorates); ``importlib.util.find_spec`` probes (transformers', torch's) see them absent,
and torch's / transformers' availability caches are filled before the stubs exist. None of them is called on the
path above (no kernel runs: only constructors and weight copies).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import socket
import sys
import types
from pathlib import Path

# keep this folder off the path so that ``import sglang`` is SGLang
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # SGLang's CPU platform (native torch layers)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
if "MASTER_PORT" not in os.environ:  # a free one: gloo's store binds it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])

STUBBED = frozenset({"triton", "sgl_kernel", "torchvision"})
NORMS = ("fc_norm", "norm_before_fc", "norm_output", "norm_before_residual")


class _Stub(type):
    """A stubbed module's attribute: a class whose attributes are more stubs; called on one callable it returns it
    (a decorator), any other call gives a stub; nothing is an instance of it."""

    def __getattr__(cls, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return stub(f"{cls.__qualname__}.{key}")

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return stub(f"{cls.__qualname__}()")

    def __getitem__(cls, key):
        return cls


def stub(name: str) -> type:
    return _Stub(name.rsplit(".", 1)[-1], (), {"__qualname__": name})


class _StubModule(types.ModuleType):
    def __getattr__(self, key):
        if key.startswith("__"):
            raise AttributeError(key)
        return stub(f"{self.__name__}.{key}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``STUBBED`` modules to import statements; availability probes (``importlib.util.find_spec``) miss."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in STUBBED:
            return None
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename.endswith(os.path.join("importlib", "util.py")):
                return None
            frame = frame.f_back
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__, module.__version__ = [], "0+stub"
        return module

    def exec_module(self, module):
        pass


def install_stubs() -> None:
    import torch.utils._triton as torch_triton
    from transformers.utils import import_utils

    torch_triton.has_triton_package(), torch_triton.has_triton()  # cached: no triton
    import_utils.is_torchvision_available()  # cached: no torchvision
    sys.meta_path.insert(0, _StubFinder())


def server_args(target: str, draft: str | None):
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(
        model_path=target,
        speculative_algorithm="EAGLE3" if draft else None,
        speculative_draft_model_path=draft,
        device="cpu",
        tp_size=1,
        trust_remote_code=False,
    )
    publish(args, role="test", ranks=SpawnRanks(world_rank=0))
    return args


def start(target: str):
    """SGLang's world of one process (``sglang.test.layer_ut_utils.init_single_process_dist``, whose module imports
    SGLang's benchmark datasets) and the target built from ``target``."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import parallel_state
    from sglang.srt.runtime_context import get_parallel, reset_context

    parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    reset_context()
    args = server_args(target, None)
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    parallel_state.initialize_model_parallel(backend="gloo")
    from sglang.srt.models.llama import LlamaForCausalLM

    return LlamaForCausalLM(ModelConfig.from_server_args(args).hf_config)


def read(target_model, target: str, path: str) -> dict:
    import torch
    from safetensors.torch import load_file
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner_components import attention_backend_setup, spec_aux_hidden_state
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    args = server_args(target, path)
    draft_config = ModelConfig.from_server_args(args, model_path=path, is_draft_model=True)
    with torch.device("cpu"):
        model = LlamaForCausalLMEagle3(draft_config.hf_config)
    aux = spec_aux_hidden_state.SpecAuxHiddenStateConfig()
    spec_aux_hidden_state._resolve_eagle_aux_hidden_state(
        config=aux,
        server_args=args,
        model_config=ModelConfig.from_server_args(args),
        spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE3"),
        is_draft_worker=False,
    )
    target_model.model.layers_to_capture = []
    attention_backend_setup.configure_aux_hidden_state_capture(
        model=target_model,
        eagle_use_aux_hidden_state=aux.eagle_use_aux_hidden_state,
        eagle_aux_hidden_state_layer_ids=aux.eagle_aux_hidden_state_layer_ids,
        dflash_use_aux_hidden_state=False,
        dflash_target_layer_ids=None,
        is_dspark=False,
    )
    params = dict(model.named_parameters())
    before = {k: p.detach().clone() for k, p in params.items()}
    try:
        model.load_weights((k, v) for f in sorted(Path(path).glob("*.safetensors")) for k, v in load_file(f).items())
        unloaded = sorted(k for k, p in params.items() if torch.equal(p.detach(), before[k]) and p.numel() > 1)
    except Exception as e:  # noqa: BLE001 - weights of another shape than the config says
        unloaded = [f"load_weights failed: {type(e).__name__}: {e}"]
    inner, layer = model.model, model.model.layers[0]
    heads = layer.self_attn.total_num_heads
    return {
        "architecture": draft_config.hf_config.architectures[0],
        "hidden_size": inner.fc.out_features,
        "intermediate_size": layer.mlp.down_proj.input_size,
        "num_attention_heads": heads,
        "head_dim": layer.self_attn.head_dim,
        "num_hidden_layers": len(inner.layers),
        "vocab_size": inner.embed_tokens.org_vocab_size,
        "draft_vocab_size": model.lm_head.org_vocab_size,
        "target_hidden_size": inner.fc.in_features // inner.num_aux_hidden_states,
        "fc_norm": inner.fc_norm is not None,
        "norm_before_fc": inner.input_norm is not None,
        "norm_output": bool(inner.norm_output),
        "norm_before_residual": False,  # not an attribute of SGLang's EAGLE-3
        "num_aux_hidden_states": inner.num_aux_hidden_states,
        "feature_layers": list(target_model.model.layers_to_capture) if aux.eagle_use_aux_hidden_state else None,
        "unloaded": unloaded,
    }


def main(src: str, dst: str) -> None:
    spec = json.loads(Path(src).read_text())
    install_stubs()
    target_model = start(spec["target"])
    out = {}
    for name, path in spec["dirs"].items():
        try:
            out[name] = read(target_model, spec["target"], path)
        except Exception as e:  # noqa: BLE001 - a config SGLang refuses is reported under its name
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    Path(dst).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

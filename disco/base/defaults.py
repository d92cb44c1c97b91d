"""Every default a user can set, and every fixed setting disco chooses, defined once (docs/architecture.md, "Defaults").

The lowest layer: plain values, no imports, so `disco --help` reads them without loading torch. The
stage that uses a default imports it from here; no other module writes the value again.
"""

# --- decoding (decode.DecodeConfig, every command that generates) -------------------------------
DEFAULT_MAX_NEW_TOKENS = 128  # generated tokens at most (EOS stops earlier)
# transformers >= 4.45: assistant_confidence_threshold = 0.4, num_assistant_tokens = 20.
DEFAULT_MAX_WINDOW = 20  # draft tokens per round at most
DEFAULT_TEMPERATURE = 0.0  # 0 = greedy: output identical to the target's greedy decoding
DEFAULT_TOP_P = 1.0  # nucleus mass when sampling (1 = the whole distribution)
DEFAULT_SEED = 0  # sampling seed

# --- training-free policies (policy.py) ---------------------------------------------------------
DEFAULT_THRESHOLD = 0.4  # threshold policy: transformers' assistant_confidence_threshold
# Leviathan et al.'s static length and transformers' heuristic schedule start at 5.
DEFAULT_K = 5
# AdaEDL's defaults (Agrawal et al. 2024, arXiv 2410.18351, Sec. 4.4; beta1, beta2, epsilon and alpha
# come from Draft & Verify); the initial lambda is not stated: 0.9 is the best of its Fig. 6 sweep.
ADAEDL_GAMMA, ADAEDL_LAMBDA, ADAEDL_BETA1, ADAEDL_BETA2, ADAEDL_EPS, ADAEDL_ALPHA = 0.2, 0.9, 0.5, 0.9, 0.01, 0.9
# SVIP's released code (github.com/Geralt-Targaryen/SVIP, vanilla-sd/eval_specbench.py): c = 0.15, h = 0.3.
SVIP_C, SVIP_H = 0.15, 0.3
# "target" is plain target-only decoding (no draft): the baseline every speedup is measured against.
# The registry that builds each one is policy_registry.POLICIES; this tuple is its key list, kept here for --help.
POLICY_NAMES = (
    "target", "constant", "heuristic", "threshold", "adaedl", "svip", "oracle", "classifier",
    "adaptive-verification", "learned-budget",
)  # fmt: skip
# vLLM's adaptive verification (vLLM 0.32's method) and disco's learned budget on vLLM's draft, in compare's rows:
# every request drafts this many positions (num_speculative_tokens; the learned budget's longest), a budget of the
# batch's best slots is verified
DEFAULT_BUDGET_K = 8
DEFAULT_POLICY = "threshold"

# --- the learned policy (classifier.py, train.py) ------------------------------------------------
RULES = ("token", "cumulative", "cost", "cost-adaptive")  # classifier.RULES: the decision rules on P(accept)
DEFAULT_RULE = "token"
MODEL_KINDS = ("lightgbm", "logistic", "mlp")
DEFAULT_MODEL = "lightgbm"
DEFAULT_VAL_FRACTION = 0.2  # share of prompts held out for metrics and tuning
DEFAULT_TRAIN_SEED = 0  # split and model seed
LABELS = ("auto", "sampled", "soft")  # what sampled traces are fitted on
DEFAULT_LABELS = "auto"
DEFAULT_BALANCED = False  # reweight accepted/rejected tokens to equal weight
DEFAULT_ABLATE = False  # also train on feature subsets and report their tuned speedups
DEFAULT_CROSS_TASK = False  # also train on each task alone and test on every task
DEFAULT_TARGET_SIGNALS = True  # fit on the previous window's target-side signals (last_*) when the traces hold them
DEFAULT_HEAD = True  # also fit an acceptance head on the draft's hidden state (traces that hold it)

# --- compare (compare.py) ----------------------------------------------------------------------
DEFAULT_COMPARE_OUT = "runs/compare"
DEFAULT_ANCHOR = True  # include the engine's own speculative decoding
DEFAULT_SEEDS = 1  # seeds per prompt (more only when sampling)

# --- cost model (cost.py) ----------------------------------------------------------------------
# Used when no `disco profile` measurement is given: a draft forward costs 0.35 target forwards (a 3x
# smaller draft, partly overhead-bound), and verifying k tokens costs 2% more per extra token than
# verifying one (GPU decoding is memory-bound: extra tokens ride along with the weights already read).
DEFAULT_DRAFT_COST = 0.35
DEFAULT_VERIFY_SLOPE = 0.02

# --- profile (profile.py) ----------------------------------------------------------------------
DEFAULT_CONTEXT = 100  # prompt tokens in the cache while timing
DEFAULT_REPEATS = 20  # timed forwards per measurement (the median is kept)
DEFAULT_WARMUP = 3  # untimed forwards before each measurement (kernels, allocator, caches)

# --- collect (collect.py) ----------------------------------------------------------------------
DEFAULT_SHARD_PROMPTS = 64  # prompts per shard: bounds shard count on big runs ...
DEFAULT_FLUSH_S = 120.0  # ... and this bounds the work a kill loses on slow ones

# --- prompt sets (prompts.py, mtbench.py) ------------------------------------------------------
# MT-Bench (Zheng et al. 2023): 80 two-turn questions, 10 per category, from the data wheel that
# mtbench.MT_BENCH pins. "mt-bench" is turn 1; "mt-bench-2" the second turn after the target's own answer.
MT_BENCH_NAMES = ("mt-bench", "mt-bench-2")
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
MT_BENCH_SPLITS = ("train", "val", "test")  # data/mt-bench-split.json: 6 / 2 / 2 questions per category

# --- demo (demo.py) ----------------------------------------------------------------------------
DEMO_PER_TASK = 1  # held-out test prompts per task in the default demo
DEMO_MAX_NEW_TOKENS = 64
FULL_TRAIN_PER_TASK = 20  # train prompts per task that `demo --full` traces
DEFAULT_DEMO_OUT = "runs/demo"
DEFAULT_PREPARE_ENGINE = "llama.cpp"  # `models prepare`: assemble the GGUFs (torch also converts them)

# --- loading a pair (options.PairOptions; each engine reads the fields it owns) -----------------
ENGINES = ("auto", "torch", "llama.cpp", "vllm")  # engines.ENGINES: the registry's names, plus auto
DEFAULT_ENGINE = (
    "auto"  # llama.cpp for GGUF files on the CPU, torch otherwise (engines.resolve_engine); vllm when named
)
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_DEVICE = "auto"  # cuda if available, else cpu
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_DTYPE = "auto"  # bfloat16 on cuda, float32 on cpu
# torch engine: how the CPU computes Linear layers (cpu_backends.py). The fastest backend that keeps float32
# greedy output unchanged (bench/results/torch-cpu.md, "CPU backends (issue 3)").
CPU_BACKENDS = ("eager", "transposed", "onednn", "int8")
DEFAULT_CPU_BACKEND = "onednn"
CPU_BACKEND_HELP = {
    "eager": "F.linear as loaded (PyTorch/MKL default; slow for 2-16 rows)",
    "transposed": "float32, (W @ x^T)^T on the same weights (no copy)",
    "onednn": "float32, weights prepacked for oneDNN: verifying k tokens costs ~one step",
    "int8": "int8 weights + per-token int8 activations (fbgemm): ~4x fewer bytes; changes the target's numbers",
}
CACHES = ("auto", "static", "dynamic")  # torch engine: the models' KV caches
DEFAULT_CACHE = "auto"  # static for decoder-only models on CUDA, dynamic elsewhere (torch_engine.resolve_cache)
VERIFY_MODES = ("fast", "exact")  # llama.cpp engine
DEFAULT_VERIFY = (
    "exact"  # lossless by default (engines/llamacpp/llamacpp.py; bench/results/llamacpp.md, "llama.cpp engine")
)
# llama.cpp engine: engines.llamacpp.llamacpp_lib.DRAFT_QUANTS + auto, none
DRAFT_QUANT_CHOICES = ("auto", "none", "q4_0", "q8_0")
DEFAULT_DRAFT_QUANT = "auto"  # q4_0 for the embedded pair, else the draft as it is
# llama.cpp engine: weight repacking. auto: on unless a child-process probe saw it crash or give non-finite
# logits for the file on this CPU and build (engines/llamacpp/llamacpp_repack.py); on: insist (refused where it failed)
REPACK_MODES = ("auto", "on", "off")
DEFAULT_REPACK = "auto"
DEFAULT_N_CTX = 4096  # llama.cpp engine: KV cache positions per model (prompt + output); capped by its training context
# llama.cpp's own defaults for draft-model speculation (vendor/llama.cpp/common/common.h,
# struct common_params_speculative_draft): compare's llama-server -md row at its defaults
LLAMA_SERVER_DRAFT_N_MAX = 3
LLAMA_SERVER_DRAFT_N_MIN = 0
LLAMA_SERVER_DRAFT_P_MIN = 0.0
# llama-server -md tuned on an artifact's validation prompts (server_tuning.tune_server, bench/tune_llama_server.py)
SERVER_TUNING_N_MAX = (4, 8, 16)  # --spec-draft-n-max values tried
SERVER_TUNING_P_MIN = (0.5, 0.7, 0.8, 0.9)  # --draft-p-min values tried
DEFAULT_N_BATCH = 512  # llama.cpp engine: tokens per llama_decode call at most (longer prompts are fed in chunks)

# --- vLLM, the serving engine (disco/vllm/) -------------------------------------------------------
# GPUs: the share of GPU memory all of a process's in-process vLLM instances take together (vLLM's own default, 0.92,
# is for one instance: a second could not start), split evenly between the instances a command plans (compare: one
# per distinct row configuration)
VLLM_GPU_MEMORY = 0.9
DEFAULT_VLLM_KV_GIB = 1  # host RAM (whole GiB: vLLM parses an int) each vLLM instance reserves for its KV cache on CPUs
SERVING_LEVELS = (1, 2, 4, 8)  # train on a batched vLLM profile: the loads its rule is chosen for (lockstep)
DEFAULT_CONCURRENCY = "1,8"  # compare --engine vllm: requests submitted together, one run per level
DEFAULT_VLLM_MAX_SEQS = 8  # requests one vLLM instance runs at once at least (more when --concurrency asks)
DEFAULT_COLLECT_MAX_BATCH = 32  # collect --engine vllm: requests at once (bench/results/collection.md: 1.17x 16's rate)
DEFAULT_VLLM_FIXED_K = 3  # vLLM's own draft-model rows: this fixed length, and the tuned one
# disco's proposers compare runs inside vLLM: "draft" on vLLM's own batched draft (vllm/draft.py), "side" on
# a draft engine of its own (side.DiscoProposer)
DEFAULT_VLLM_PROPOSERS = ("draft", "side")
# the side-engine proposer's batched llama.cpp draft (engines/llamacpp/llamacpp_batch.py): sequences per context (one per
# request; a context reserves KV cells for all of them at once, n_ctx each; more requests open another context)
SIDE_DRAFT_SEQS = 8
VLLM_MAX_MODEL_LEN = 4096  # positions a vLLM instance holds per request at most (capped by the target's own)
# profile --engine vllm (vllm/stages.profile_load): batch sizes (up to --max-batch) and constant windows (up to
# --max-window, which is always timed) whose steps are timed
VLLM_PROFILE_BATCHES = (1, 2, 4, 8, 16, 32)
VLLM_PROFILE_WINDOWS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 20)

# --- closed loop: costs, calibration and a governor from the serving process's own steps ----------
# (online_costs.py, online_calibration.py, governor.py; docs/architecture.md, "Closed loop")
ONLINE_COST_WINDOW = 25  # observations a cost bucket keeps (its median: 13 of 25 must agree to move it)
ONLINE_COST_REBUILD = (
    64  # observations between two rebuilds of the cost model (after 1, 2, 4, ..., 32 while warming up)
)
ONLINE_COST_WARMUP = 8  # observations of each kind (target steps, draft positions) before the table counts as measured
ONLINE_COST_BUMP = 0.05  # a timed cost bucket slower than a larger one by more than this share ...
ONLINE_COST_BUMP_SE = 3.0  # ... and by more than this many standard errors keeps its estimate (not made monotone)
# a seed profile whose cost ratio between two timed sizes is off this process's by more than this factor, either way,
# is another process's: its shape is dropped (online_costs.OnlineCosts); noise moves a ratio of medians ~20 %
SEED_SHAPE_TOLERANCE = 1.5
CALIBRATION_BUFFER = 512  # verified outcomes kept per draft position (a ring)
CALIBRATION_HALF_LIFE = 128  # outcomes after which an outcome weighs half in the fit (a shift shows within ~1.6x this)
CALIBRATION_MIN = 64  # outcomes of a position before its calibration leaves the identity
CALIBRATION_REFIT = 8  # observe() calls (steps) between two refits
CALIBRATION_NEWTON = 6  # Newton steps per refit (from the last fit)
CALIBRATION_PRIOR = 1.0  # L2 pull of (a, b) toward the identity (1, 0), in outcomes' worth (keeps a fit finite)
# the closed loop's first steps draft at these fixed lengths in turn, three times each (as the window allows): the
# cost table then holds measured steps of several widths and draft positions whatever the seed says pays
CLOSED_LOOP_PROBES = (1, 2, 4, 8)
# a later batch band is probed (the short lengths) only if its first this many steps drafted < 1 token a request
CLOSED_LOOP_BAND_WATCH = 4
# set to a file: one JSON line there per step the closed loop judged (online/closed_loop.py)
CLOSED_LOOP_LOG_ENV = "DISCO_CLOSED_LOOP_LOG"
GOVERNOR_WINDOW = 32  # steps the governor judges on (a spell of the policy, a trial, a fixed length)
GOVERNOR_MARGIN = 0.05  # a drafting length must beat the policy by this share to take over (k = 0: by nothing)
GOVERNOR_HOLD = 64  # steps on a fixed length before the policy is tried again (doubled after each failed trial) ...
GOVERNOR_MAX_HOLD = 1024  # ... up to this
GOVERNOR_MEMORY = 64  # steps: the per-position acceptance counts decay by 1 - 1/this each step

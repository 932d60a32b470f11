"""`TrainingArguments` against the real `transformers.TrainingArguments` 5.23.

Every comparison builds HF's object and ours from the same input and compares what
they expose; no expected value here comes from our own code.
"""

import dataclasses
import inspect
import json
import pickle
import warnings

import pytest
import torch
import transformers

from hf_lightning.args import TrainingArguments

HF_FIELDS = [f for f in dataclasses.fields(transformers.TrainingArguments) if f.init]
OUR_FIELDS = {f.name: f for f in dataclasses.fields(TrainingArguments)}
HAS_BF16_ACCELERATOR = torch.cuda.is_available() or torch.backends.mps.is_available()


def _default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()


# ---------------------------------------------------------------------------------------------
# Fields, order and defaults
# ---------------------------------------------------------------------------------------------


def test_every_hf_field_exists_here():
    missing = [f.name for f in HF_FIELDS if f.name not in OUR_FIELDS]
    assert missing == []


def test_positional_order_matches_hf():
    hf_params = list(inspect.signature(transformers.TrainingArguments).parameters)
    ours = list(inspect.signature(TrainingArguments).parameters)
    assert ours[: len(hf_params)] == hf_params
    # The 4.x aliases come after, keyword-only, so HF's positional order is untouched.
    extra = [p for p in inspect.signature(TrainingArguments).parameters.values() if p.name not in hf_params]
    assert extra and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra)


@pytest.mark.parametrize("hf_field", HF_FIELDS, ids=lambda f: f.name)
def test_default_matches_hf(hf_field):
    assert _default(OUR_FIELDS[hf_field.name]) == _default(hf_field)


@pytest.mark.parametrize("hf_field", HF_FIELDS, ids=lambda f: f.name)
def test_parser_metadata_matches_hf(hf_field):
    # nargs/const/choices drive the argument parser: a bare `--activation_checkpointing` etc.
    ours = {k: v for k, v in OUR_FIELDS[hf_field.name].metadata.items() if k != "help"}
    theirs = {k: (list(v) if k == "choices" else v) for k, v in hf_field.metadata.items() if k != "help"}
    ours = {k: (list(v) if k == "choices" else v) for k, v in ours.items()}
    assert ours == theirs
    assert OUR_FIELDS[hf_field.name].metadata.get("help")


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="no_such_argument"):
        transformers.TrainingArguments(no_such_argument=1)
    with pytest.raises(TypeError, match="no_such_argument"):
        TrainingArguments(no_such_argument=1)


@pytest.mark.parametrize(
    "name, value, enum_values",
    [
        ("eval_strategy", "step", "['no', 'steps', 'epoch']"),
        ("logging_strategy", "always", "['no', 'steps', 'epoch']"),
        ("save_strategy", "sometimes", "['no', 'steps', 'epoch', 'best']"),
        ("hub_strategy", "never", "['end', 'every_save', 'checkpoint', 'all_checkpoints']"),
        ("lr_scheduler_type", "cosine_annealing", "'linear', 'cosine'"),
        ("optim", "adam", "'adamw_torch', 'adamw_torch_fused'"),
        ("debug", "overflow", "['underflow_overflow', 'tpu_metrics_debug']"),
    ],
)
def test_invalid_enum_value_lists_the_valid_values(name, value, enum_values):
    with pytest.raises(ValueError):
        transformers.TrainingArguments(use_cpu=True, **{name: value})
    with pytest.raises(ValueError) as error:
        TrainingArguments(**{name: value})
    message = str(error.value)
    assert message.startswith(f"{name}:")
    assert enum_values in message


# ---------------------------------------------------------------------------------------------
# Validation errors: HF rejects -> we reject, with a message naming the field
# ---------------------------------------------------------------------------------------------

_LBMAE = {"load_best_model_at_end": True}

REJECTED = [
    (
        "cache_steps_zero",
        {"torch_empty_cache_steps": 0},
        r"`torch_empty_cache_steps` must be an integer bigger than 0, got 0",
    ),
    ("cache_steps_negative", {"torch_empty_cache_steps": -5}, r"`torch_empty_cache_steps` must be .* got -5"),
    ("cache_steps_float", {"torch_empty_cache_steps": 1.5}, r"`torch_empty_cache_steps` must be .* got 1.5"),
    ("logging_steps_zero", {"logging_steps": 0}, r"logging strategy .* requires non-zero --logging_steps"),
    (
        "eval_steps_fallback_impossible",
        {"eval_strategy": "steps", "logging_steps": 0},
        r"evaluation strategy IntervalStrategy.STEPS requires either non-zero --eval_steps or --logging_steps",
    ),
    (
        "eval_steps_zero_logging_zero",
        {"eval_strategy": "steps", "eval_steps": 0, "logging_steps": 0},
        r"requires either non-zero --eval_steps or --logging_steps",
    ),
    ("logging_steps_fractional", {"logging_steps": 2.5}, r"--logging_steps must be an integer if bigger than 1: 2.5"),
    (
        "eval_steps_fractional",
        {"eval_strategy": "steps", "eval_steps": 3.5},
        r"--eval_steps must be an integer if bigger than 1: 3.5",
    ),
    ("save_steps_fractional", {"save_steps": 10.5}, r"--save_steps must be an integer if bigger than 1: 10.5"),
    (
        "lbmae_no_eval",
        {**_LBMAE},
        r"--load_best_model_at_end requires the save and eval strategy to match.*\n- Evaluation strategy: "
        r"IntervalStrategy.NO\n- Save strategy: SaveStrategy.STEPS",
    ),
    (
        "lbmae_epoch_vs_steps",
        {**_LBMAE, "eval_strategy": "epoch"},
        r"--load_best_model_at_end requires the save and eval strategy to match",
    ),
    (
        "lbmae_steps_vs_epoch",
        {**_LBMAE, "eval_strategy": "steps", "save_strategy": "epoch"},
        r"--load_best_model_at_end requires the save and eval strategy to match",
    ),
    (
        "lbmae_save_not_round_multiple",
        {**_LBMAE, "eval_strategy": "steps", "eval_steps": 2, "save_steps": 5},
        r"--load_best_model_at_end requires the saving steps to be a round multiple of the evaluation steps, "
        r"but found 5, which is not a round multiple of 2.",
    ),
    (
        "lbmae_ratio_eval_absolute_save",
        {**_LBMAE, "eval_strategy": "steps", "eval_steps": 0.2, "save_steps": 5},
        r"--load_best_model_at_end .* mixing ratio and absolute steps for save_steps 5 and eval_steps 0.2",
    ),
    (
        "lbmae_absolute_eval_ratio_save",
        {**_LBMAE, "eval_strategy": "steps", "eval_steps": 3, "save_steps": 0.5},
        r"--load_best_model_at_end .* mixing ratio and absolute steps",
    ),
    (
        "lbmae_ratios_not_multiple",
        {**_LBMAE, "eval_strategy": "steps", "eval_steps": 0.2, "save_steps": 0.5},
        r"--load_best_model_at_end .* but found 0.5, which is not a multiple of 0.2.",
    ),
    ("fp16_and_bf16", {"fp16": True, "bf16": True, "use_cpu": True}, r"At most one of fp16 and bf16 can be True"),
    (
        "full_eval_fp16_and_bf16",
        {"fp16_full_eval": True, "bf16_full_eval": True, "use_cpu": True},
        r"At most one of fp16 and bf16 can be True for full eval",
    ),
    (
        "plateau_without_eval",
        {"lr_scheduler_type": "reduce_lr_on_plateau"},
        r"lr_scheduler_type reduce_lr_on_plateau requires an eval strategy",
    ),
    ("greedy_without_eval", {"lr_scheduler_type": "greedy"}, r"lr_scheduler_type greedy requires an eval strategy"),
    ("warmup_negative", {"warmup_steps": -1}, r"Got warmup_steps = -1, Expected value warmup_steps >= 0"),
    ("warmup_negative_ratio", {"warmup_steps": -0.5}, r"Got warmup_steps = -0.5, Expected value warmup_steps >= 0"),
    (
        "prefetch_without_workers",
        {"dataloader_prefetch_factor": 2},
        r"--dataloader_prefetch_factor can only be set when data is loaded in a different process",
    ),
    ("eval_strategy_typo", {"eval_strategy": "step"}, r"eval_strategy: 'step' is not a valid IntervalStrategy"),
    ("save_strategy_typo", {"save_strategy": "always"}, r"save_strategy: 'always' is not a valid SaveStrategy"),
    ("logging_strategy_typo", {"logging_strategy": "batch"}, r"logging_strategy: 'batch' is not a valid"),
    ("scheduler_typo", {"lr_scheduler_type": "cosine_annealing"}, r"lr_scheduler_type: 'cosine_annealing' is not"),
    ("optim_typo", {"optim": "adamw"}, r"optim: 'adamw' is not a valid OptimizerNames"),
    ("hub_strategy_typo", {"hub_strategy": "never"}, r"hub_strategy: 'never' is not a valid HubStrategy"),
    ("debug_typo", {"debug": "overflow"}, r"debug: 'overflow' is not a valid DebugOption"),
    ("fsdp_unknown_word", {"fsdp": "full_shard bogus", "use_cpu": True}, r"Unknown `fsdp` option: bogus"),
    (
        "fsdp_v1_only_word",
        {"fsdp": "hybrid_shard", "use_cpu": True},
        r"`fsdp=hybrid_shard` is only available with FSDP1",
    ),
    (
        "fsdp_bad_wrap_policy",
        {"fsdp": True, "fsdp_config": {"auto_wrap_policy": "EVERY_LAYER"}, "use_cpu": True},
        r"`auto_wrap_policy` must be one of",
    ),
    ("lr_scheduler_kwargs_bad_json", {"lr_scheduler_kwargs": "{num_cycles: 2"}, r"lr_scheduler_kwargs"),
    pytest.param(
        "bf16_without_accelerator",
        {"bf16": True},
        r"Your setup doesn't support bf16/gpu. You need to assign use_cpu",
        id="bf16_without_accelerator",
        marks=pytest.mark.skipif(HAS_BF16_ACCELERATOR, reason="bf16 is supported on this machine"),
    ),
    pytest.param(
        "bf16_full_eval_without_accelerator",
        {"bf16_full_eval": True},
        r"doesn't support bf16/gpu",
        id="bf16_full_eval_without_accelerator",
        marks=pytest.mark.skipif(HAS_BF16_ACCELERATOR, reason="bf16 is supported on this machine"),
    ),
    pytest.param(
        "tf32_without_ampere",
        {"tf32": True},
        r"--tf32 requires Ampere or a newer GPU arch",
        id="tf32_without_ampere",
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU may support tf32"),
    ),
]


REJECTED = [case if hasattr(case, "marks") else pytest.param(*case, id=case[0]) for case in REJECTED]


@pytest.mark.parametrize("name, kwargs, message", REJECTED)
def test_rejected_like_hf(name, kwargs, message):
    with pytest.raises(ValueError) as hf_error:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            transformers.TrainingArguments(**kwargs)
    with pytest.raises(ValueError, match=message) as ours_error:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            TrainingArguments(**kwargs)
    assert isinstance(ours_error.value, ValueError)
    # HF's own text for the same input, where it is deterministic, is what we show too.
    if not name.endswith("_typo") and name not in ("lr_scheduler_kwargs_bad_json",):
        assert str(hf_error.value).split("\n")[0][:40] in str(ours_error.value)


def test_at_least_thirty_rejections():
    assert len(REJECTED) >= 30


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fp16": True, "use_cpu": True},
        {"bf16": True, "use_cpu": True},
        {"save_steps": 0},
        {"eval_strategy": "steps", "eval_steps": -3},
        {"save_strategy": "best", "eval_strategy": "no"},
        {"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 0.2, "save_steps": 0.4},
        {"load_best_model_at_end": True, "eval_strategy": "no", "save_strategy": "best"},
        {"logging_strategy": "no", "logging_steps": 2.5},
        {"tf32": False},
    ],
    ids=repr,
)
def test_accepted_like_hf(kwargs, build_both):
    hf, ours = build_both(kwargs)
    assert ours.to_dict() == hf.to_dict()


# ---------------------------------------------------------------------------------------------
# Derived values
# ---------------------------------------------------------------------------------------------

DERIVED_GRID = [
    {},
    {"output_dir": None},
    {"output_dir": "~/runs/x"},
    {"eval_strategy": "steps"},
    {"eval_strategy": "steps", "logging_steps": 10},
    {"eval_strategy": "steps", "eval_steps": 0, "logging_steps": 7},
    {"eval_strategy": "steps", "eval_steps": 0.1},
    {"eval_strategy": "steps", "eval_steps": 30.0},
    {"eval_strategy": "epoch"},
    {"do_eval": True},
    {"load_best_model_at_end": True, "eval_strategy": "steps", "save_steps": 500},
    {"load_best_model_at_end": True, "eval_strategy": "steps", "eval_steps": 5, "save_steps": 20},
    {"load_best_model_at_end": True, "eval_strategy": "epoch", "save_strategy": "epoch"},
    {"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "best"},
    {"metric_for_best_model": "accuracy"},
    {"metric_for_best_model": "eval_loss"},
    {"metric_for_best_model": "f1", "greater_is_better": False},
    {"lr_scheduler_type": "reduce_lr_on_plateau", "eval_strategy": "epoch"},
    {"lr_scheduler_type": "greedy", "eval_strategy": "steps", "eval_steps": 5},
    {"report_to": "tensorboard"},
    {"report_to": ["tensorboard"]},
    {"report_to": ["none"]},
    {"report_to": "wandb"},
    {"include_num_input_tokens_seen": True},
    {"include_num_input_tokens_seen": False},
    {"include_num_input_tokens_seen": "non_padding"},
    {"logging_steps": 10.0},
    {"logging_steps": 1.0},
    {"logging_steps": 0.05},
    {"save_steps": 20.0},
    {"save_strategy": "no", "save_steps": 3.5},
    {"warmup_steps": 10},
    {"warmup_steps": 0.1},
    {"per_device_train_batch_size": 4, "per_device_eval_batch_size": 16},
    {"use_cpu": True},
    {"use_cpu": True, "fp16": True},
    {"use_cpu": True, "bf16": True},
    {"use_cpu": True, "bf16_full_eval": True},
    {"torch_compile": True},
    {"torch_compile_mode": "reduce-overhead"},
    {"torch_compile_backend": "aot_eager"},
    {"gradient_checkpointing": True},
    {"activation_checkpointing": True},
    {"gradient_checkpointing": True, "activation_checkpointing": False},
    {"gradient_checkpointing_kwargs": {"use_reentrant": False}},
    {"activation_checkpointing_kwargs": '{"use_reentrant": "false"}'},
    {"lr_scheduler_kwargs": '{"num_cycles": "2", "power": "1.5", "nested": {"flag": "true"}, "name": "x"}'},
    {"lr_scheduler_kwargs": {"num_cycles": 3}},
    {"log_level": "info"},
    {"log_level": "error", "log_level_replica": "debug"},
    {"disable_tqdm": True},
    {"debug": ""},
    {"debug": []},
    {"fsdp": True},
    {"fsdp": "full_shard auto_wrap", "fsdp_config": {"fsdp_min_num_params": 0}},
    {"fsdp": "shard_grad_op offload"},
    {"fsdp": ["full_shard"], "fsdp_config": {"version": 1}},
    {"fsdp": True, "fsdp_config": {"transformer_layer_cls_to_wrap": "GPT2Block"}},
    {"fsdp": True, "fsdp_config": '{"cpu_offload": "true", "min_num_params": "100"}'},
    {"fsdp_config": {"cpu_offload": True}},
    {"accelerator_config": {"even_batches": False}},
    {"accelerator_config": '{"use_seedable_sampler": "false"}'},
    {"dataloader_num_workers": 2, "dataloader_prefetch_factor": 4},
    {"eval_delay": 2, "eval_strategy": "epoch"},
    {"save_strategy": "best", "eval_strategy": "steps", "eval_steps": 10},
    {"optim": "sgd"},
    {"optim": "adamw_torch"},
    {"hub_model_id": "me/x", "hub_token": "secret", "hub_strategy": "checkpoint"},
    {"include_for_metrics": ["inputs", "loss"]},
    {"label_names": ["labels"], "train_sampling_strategy": "group_by_length"},
    {"deepspeed": None, "ddp_timeout": 60, "ddp_bucket_cap_mb": 25, "ddp_find_unused_parameters": False},
    {"max_steps": 100, "num_train_epochs": 1.5, "seed": 7, "data_seed": 3},
    {"local_rank": -1, "do_train": True, "do_predict": True, "resume_from_checkpoint": "ckpt"},
]

PROPERTIES = [
    "train_batch_size",
    "eval_batch_size",
    "n_gpu",
    "device",
    "world_size",
    "process_index",
    "local_process_index",
    "should_log",
    "should_save",
    "place_model_on_device",
    "ddp_timeout_delta",
    "mixed_precision",
]


@pytest.mark.parametrize("kwargs", DERIVED_GRID, ids=repr)
def test_derived_values_match_hf(kwargs, build_both):
    hf, ours = build_both({"report_to": "none", **kwargs})
    assert ours.to_dict() == hf.to_dict()
    for name in PROPERTIES:
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.parallel_mode.value == hf.parallel_mode.value
    assert ours.get_process_log_level() == hf.get_process_log_level()
    for total in (1, 7, 100, 1001):
        assert ours.get_warmup_steps(total) == hf.get_warmup_steps(total)


@pytest.mark.parametrize("warmup_steps", [0, 1, 5, 10.0, 0.0, 0.01, 0.1, 0.25, 0.5, 0.999])
@pytest.mark.parametrize("total", [1, 3, 10, 97, 1000])
def test_get_warmup_steps_matches_hf(warmup_steps, total, build_both):
    hf, ours = build_both({"warmup_steps": warmup_steps, "report_to": "none"})
    assert ours.get_warmup_steps(total) == hf.get_warmup_steps(total)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"eval_strategy": "steps", "logging_steps": 25},
        {"eval_strategy": "steps", "logging_steps": 25.0, "save_steps": 50.0},
        {"load_best_model_at_end": True, "eval_strategy": "epoch", "save_strategy": "epoch"},
    ],
    ids=repr,
)
def test_integral_float_and_fallback_types(kwargs, build_both):
    hf, ours = build_both({"report_to": "none", **kwargs})
    for name in ("logging_steps", "eval_steps", "save_steps"):
        assert type(getattr(ours, name)) is type(getattr(hf, name))


def test_report_to_all_is_hfs_list(build_both):
    hf, ours = build_both({"report_to": "all"})
    assert ours.report_to == hf.report_to
    assert "tensorboard" in ours.report_to  # tensorboard is a runtime dependency


def test_report_to_none_value_means_no_loggers():
    # Documented difference: HF 5.23 stores [None]; we read None as "none".
    assert TrainingArguments(report_to=None).report_to == []


def test_disable_tqdm_follows_logger_level(build_both):
    hf, ours = build_both({})
    assert ours.disable_tqdm is hf.disable_tqdm is False


def test_accelerator_config_from_json_file(tmp_path, build_both):
    path = tmp_path / "accelerator.json"
    path.write_text(json.dumps({"even_batches": False, "non_blocking": True}))
    hf, ours = build_both({"accelerator_config": str(path), "report_to": "none"})
    assert ours.to_dict() == hf.to_dict()


def test_fsdp_config_from_json_file(tmp_path, build_both):
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"fsdp_transformer_layer_cls_to_wrap": "Block", "cpu_offload": True}))
    hf, ours = build_both({"fsdp": True, "fsdp_config": str(path), "report_to": "none"})
    assert ours.to_dict() == hf.to_dict()
    assert ours.fsdp is True


def test_unknown_accelerator_config_key_names_it():
    with pytest.raises((TypeError, ValueError)):
        transformers.TrainingArguments(accelerator_config={"bogus": 1})
    with pytest.raises(ValueError, match=r"accelerator_config has unknown keys \['bogus'\]"):
        TrainingArguments(accelerator_config={"bogus": 1})


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"log_level": "loud"}, r"log_level='loud' is not valid"),
        ({"log_level_replica": "WARNING"}, r"log_level_replica='WARNING' is not valid"),
        ({"include_num_input_tokens_seen": "some"}, r"include_num_input_tokens_seen='some' is not valid"),
        ({"train_sampling_strategy": "shuffled"}, r"train_sampling_strategy='shuffled' is not valid"),
    ],
)
def test_closed_choices_hf_only_checks_in_its_parser(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainingArguments(**kwargs)


def test_input_dicts_are_not_mutated():
    config = {"fsdp_cpu_offload": True}
    TrainingArguments(fsdp=True, fsdp_config=config)
    assert config == {"fsdp_cpu_offload": True}


# ---------------------------------------------------------------------------------------------
# Distributed values from the launcher's environment
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env, kwargs, expected",
    [
        # (world_size, process_index, local_process_index, parallel_mode, should_log, should_save)
        ({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}, {}, (4, 3, 1, "distributed", False, False)),
        ({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0"}, {}, (4, 2, 0, "distributed", True, False)),
        (
            {"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0"},
            {"log_on_each_node": False, "save_on_each_node": True},
            (4, 2, 0, "distributed", False, True),
        ),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, {}, (2, 0, 0, "distributed", True, True)),
    ],
)
def test_distributed_values_come_from_the_environment(env, kwargs, expected, monkeypatch):
    # Expected values follow HF's rules (reference §13.1/§14): rank-0 tests per node or globally.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = TrainingArguments(use_cpu=True, **kwargs)
    observed = (
        args.world_size,
        args.process_index,
        args.local_process_index,
        args.parallel_mode.value,
        args.should_log,
        args.should_save,
    )
    assert observed == expected
    assert args.n_gpu == 0
    assert args.train_batch_size == args.per_device_train_batch_size
    assert not torch.distributed.is_initialized()


def test_main_process_first_runs_the_block_without_a_process_group(build_both):
    hf, ours = build_both({"use_cpu": True})
    ran = []
    for args in (hf, ours):
        with args.main_process_first(desc="tokenize"):
            ran.append(type(args).__module__)
    assert len(ran) == 2


# ---------------------------------------------------------------------------------------------
# Serialization
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"eval_strategy": "steps", "eval_steps": 5, "hub_token": "secret", "include_num_input_tokens_seen": True},
        {"lr_scheduler_type": "cosine", "optim": "sgd", "label_names": ["labels"], "report_to": "tensorboard"},
    ],
    ids=repr,
)
def test_serialization_matches_hf(kwargs, build_both):
    hf, ours = build_both({"report_to": "none", **kwargs})
    assert ours.to_json_string() == hf.to_json_string()
    assert ours.to_sanitized_dict() == hf.to_sanitized_dict()


def test_tokens_are_masked_everywhere(build_both):
    hf, ours = build_both({"hub_token": "hf_secret_value", "report_to": "none"})
    for args in (hf, ours):
        assert "hf_secret_value" not in repr(args)
        assert "hf_secret_value" not in str(args)
        assert "hub_token=<HUB_TOKEN>," in repr(args)
        assert args.to_dict()["hub_token"] == "<HUB_TOKEN>"


def test_repr_lists_the_same_fields_as_hf(build_both):
    hf, ours = build_both({"report_to": "none"})

    def names(text):
        return [line.split("=", 1)[0] for line in text.splitlines()[1:-1]]

    assert names(repr(ours)) == names(repr(hf))


def test_to_dict_converts_nested_dtypes(build_both):
    hf, ours = build_both({"report_to": "none", "lr_scheduler_kwargs": {"inner": {"dtype": torch.bfloat16}}})
    expected = {"inner": {"dtype": "bfloat16"}}
    assert ours.to_dict()["lr_scheduler_kwargs"] == hf.to_dict()["lr_scheduler_kwargs"] == expected
    assert ours.lr_scheduler_kwargs["inner"]["dtype"] is torch.bfloat16


def test_round_trips_through_to_dict_pickle_and_replace():
    with pytest.warns(FutureWarning):
        args = TrainingArguments(evaluation_strategy="steps", logging_steps=10, report_to="none")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rebuilt = TrainingArguments(**args.to_dict())
        replaced = dataclasses.replace(args, eval_steps=20)
    assert rebuilt.to_dict() == args.to_dict()
    assert replaced.eval_steps == 20 and replaced.eval_strategy == "steps"
    assert pickle.loads(pickle.dumps(args)).to_dict() == args.to_dict()


# ---------------------------------------------------------------------------------------------
# Grouped setters
# ---------------------------------------------------------------------------------------------

SETTER_CALLS = [
    ("set_training", {"learning_rate": 1e-4, "batch_size": 4, "weight_decay": 0.01, "num_epochs": 2, "seed": 3}),
    ("set_training", {"gradient_checkpointing": True}),
    ("set_evaluate", {"strategy": "steps", "steps": 100, "batch_size": 32, "delay": 1.0, "loss_only": True}),
    ("set_evaluate", {"strategy": "epoch"}),
    ("set_testing", {"batch_size": 32, "loss_only": True}),
    ("set_save", {"strategy": "epoch", "total_limit": 2, "on_each_node": True}),
    ("set_logging", {"strategy": "steps", "steps": 10, "level": "info", "first_step": True, "nan_inf_filter": True}),
    ("set_optimizer", {"name": "sgd", "learning_rate": 0.1, "beta1": 0.8, "args": "momentum=0.9"}),
    ("set_lr_scheduler", {"name": "cosine", "warmup_steps": 0.05, "max_steps": 100}),
    ("set_dataloader", {"train_batch_size": 16, "num_workers": 2, "prefetch_factor": 2, "sampler_seed": 5}),
]


@pytest.mark.parametrize("method, kwargs", SETTER_CALLS, ids=[c[0] + repr(sorted(c[1])) for c in SETTER_CALLS])
def test_setters_match_hf(method, kwargs, build_both):
    hf, ours = build_both({"report_to": "none"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert getattr(hf, method)(**kwargs) is hf
        assert getattr(ours, method)(**kwargs) is ours
    hf_dict, our_dict = hf.to_dict(), ours.to_dict()
    if method == "set_logging":
        # Documented difference: we normalise report_to ("none" -> []); HF stores the raw value.
        assert hf_dict.pop("report_to") == "none" and our_dict.pop("report_to") == []
    assert our_dict == hf_dict


@pytest.mark.parametrize("method", ["set_evaluate", "set_save", "set_logging"])
def test_setters_reject_zero_steps_like_hf(method, build_both):
    hf, ours = build_both({"report_to": "none"})
    for args in (hf, ours):
        with pytest.raises(ValueError, match=r"Setting `strategy` as 'steps' requires a positive value for `steps`"):
            getattr(args, method)(strategy="steps", steps=0)


def test_set_evaluate_rejects_unknown_strategy_naming_the_field():
    with pytest.raises(ValueError, match=r"eval_strategy: 'sometimes' is not a valid IntervalStrategy"):
        TrainingArguments().set_evaluate(strategy="sometimes")


# ---------------------------------------------------------------------------------------------
# The migration guide covers every field
# ---------------------------------------------------------------------------------------------


def test_migration_guide_has_a_row_for_every_field():
    from pathlib import Path

    from hf_lightning.args import Seq2SeqTrainingArguments

    guide = (Path(__file__).resolve().parents[3] / "docs" / "migration.md").read_text(encoding="utf-8")
    missing = [f.name for f in dataclasses.fields(Seq2SeqTrainingArguments) if f"| `{f.name}` |" not in guide]
    assert missing == []
    assert "## HF behaviours reproduced on purpose" in guide

"""transformers 4.x argument names and the settings hf_lightning refuses.

A 4.x name is checked by building our arguments with it and HF 5.23's with the 5.x
spelling it maps to: both must serialize the same (plus the aliases we keep on purpose).
"""

import warnings

import pytest
import transformers

from hf_lightning.args import TrainingArguments

# (4.x keyword arguments, the HF 5.23 keyword arguments they mean)
MAPPED = [
    ({"evaluation_strategy": "steps"}, {"eval_strategy": "steps"}),
    ({"evaluation_strategy": "epoch", "eval_strategy": "epoch"}, {"eval_strategy": "epoch"}),
    ({"per_gpu_train_batch_size": 4}, {"per_device_train_batch_size": 4}),
    ({"per_gpu_eval_batch_size": 3}, {"per_device_eval_batch_size": 3}),
    ({"warmup_ratio": 0.1}, {"warmup_steps": 0.1}),
    ({"warmup_ratio": 0.0}, {}),
    ({"group_by_length": True}, {"train_sampling_strategy": "group_by_length"}),
    ({"group_by_length": False}, {}),
    ({"no_cuda": True}, {"use_cpu": True}),
    ({"no_cuda": False}, {}),
    ({"adafactor": True}, {"optim": "adafactor"}),
    ({"include_inputs_for_metrics": True}, {"include_for_metrics": ["inputs"]}),
    (
        {"include_inputs_for_metrics": True, "include_for_metrics": ["loss"]},
        {"include_for_metrics": ["loss", "inputs"]},
    ),
    ({"push_to_hub_token": "tok"}, {"hub_token": "tok"}),
    ({"push_to_hub_model_id": "model", "push_to_hub_organization": "org"}, {"hub_model_id": "org/model"}),
    ({"push_to_hub_model_id": "model"}, {"hub_model_id": "model"}),
    (
        {"output_dir": "runs/exp1", "push_to_hub_organization": "org"},
        {"output_dir": "runs/exp1", "hub_model_id": "org/exp1"},
    ),
    ({"torchdynamo": "eager"}, {"torch_compile_backend": "eager"}),
    ({"fsdp": True, "fsdp_min_num_params": 1000}, {"fsdp": True, "fsdp_config": {"min_num_params": 1000}}),
    (
        {"fsdp": True, "fsdp_transformer_layer_cls_to_wrap": "GPT2Block"},
        {"fsdp": True, "fsdp_config": {"transformer_layer_cls_to_wrap": "GPT2Block"}},
    ),
    ({"jit_mode_eval": False}, {}),
    ({"use_ipex": False}, {}),
    ({"past_index": -1}, {}),
    ({"fp16_opt_level": "O1"}, {}),
    ({"tpu_metrics_debug": False}, {}),
    ({"use_legacy_prediction_loop": False}, {}),
    ({"include_tokens_per_second": False}, {}),
    ({"mp_parameters": ""}, {}),
    ({"ray_scope": "last"}, {}),
]


@pytest.mark.parametrize("legacy, modern", MAPPED, ids=repr)
def test_4x_name_maps_to_the_5x_field(legacy, modern, monkeypatch):
    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)
    with pytest.warns(FutureWarning, match=r"transformers 4\.x argument"):
        ours = TrainingArguments(report_to="none", **legacy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.TrainingArguments(report_to="none", **modern)
    assert ours.to_dict() == hf.to_dict()
    for name in legacy:
        if name not in modern:
            # Mapped aliases are cleared so a rebuilt copy does not map them twice.
            assert getattr(ours, name) is None


@pytest.mark.parametrize(
    "legacy",
    [
        {"logging_dir": "tb/logs"},
        {"overwrite_output_dir": True},
        {"overwrite_output_dir": False},
        {"save_safetensors": True},
        {"use_mps_device": False},
        {"half_precision_backend": "auto"},
        {"fp16_backend": "cpu_amp"},
    ],
    ids=repr,
)
def test_4x_names_without_a_5x_home_are_kept_and_serialized(legacy):
    with pytest.warns(FutureWarning, match=r"transformers 4\.x argument"):
        ours = TrainingArguments(report_to="none", **legacy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.TrainingArguments(report_to="none")
    assert ours.to_dict() == {**hf.to_dict(), **legacy}
    for name, value in legacy.items():
        assert getattr(ours, name) == value


def test_logging_dir_expands_the_home_directory(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    with pytest.warns(FutureWarning, match="TensorBoard"):
        args = TrainingArguments(logging_dir="~/tb")
    assert args.logging_dir == "/home/someone/tb"


def test_warmup_ratio_with_warmup_steps_keeps_the_steps_like_4x():
    with pytest.warns(UserWarning, match=r"warmup_steps wins"), pytest.warns(FutureWarning, match="warmup_ratio"):
        args = TrainingArguments(warmup_ratio=0.2, warmup_steps=5)
    assert args.warmup_steps == 5
    assert args.get_warmup_steps(100) == 5


@pytest.mark.parametrize("name", ["evaluation_strategy", "warmup_ratio", "logging_dir", "overwrite_output_dir",
                                  "group_by_length", "save_safetensors", "no_cuda", "per_gpu_train_batch_size"])
def test_hf_5_really_removed_these_names(name):
    with pytest.raises(TypeError, match=name):
        transformers.TrainingArguments(**{name: None})


REFUSED_LEGACY = [
    ({"save_safetensors": False}, r"`save_safetensors=False` is not supported .* always saved as safetensors"),
    ({"use_ipex": True}, r"`use_ipex=True` is not supported"),
    ({"jit_mode_eval": True}, r"`jit_mode_eval=True` is not supported .*torch_compile"),
    ({"fp16_opt_level": "O2"}, r"`fp16_opt_level='O2'` is not supported .* fp16=True"),
    ({"half_precision_backend": "apex"}, r"`half_precision_backend='apex'` is not supported"),
    ({"fp16_backend": "apex"}, r"`fp16_backend='apex'` is not supported"),
    ({"half_precision_backend": "cuda_magic"}, r"half_precision_backend='cuda_magic' is not valid"),
    ({"tpu_num_cores": 8}, r"`tpu_num_cores=8` is not supported .* TPUs"),
    ({"tpu_metrics_debug": True}, r"`tpu_metrics_debug=True` is not supported"),
    ({"past_index": 0}, r"`past_index=0` is not supported"),
    ({"use_legacy_prediction_loop": True}, r"`use_legacy_prediction_loop=True` is not supported"),
    ({"include_tokens_per_second": True}, r"`include_tokens_per_second=True` is not supported"),
    ({"mp_parameters": "partitions=2"}, r"`mp_parameters='partitions=2'` is not supported .* SageMaker"),
    ({"ray_scope": "all"}, r"`ray_scope='all'` is not supported .* RAY_SCOPE environment variable"),
    ({"warmup_ratio": 1.5}, r"warmup_ratio must lie in range \[0,1\], got 1.5"),
    ({"warmup_ratio": -0.1}, r"warmup_ratio must lie in range \[0,1\]"),
    ({"warmup_ratio": 1.0}, r"warmup_ratio=1.0 cannot be expressed .* warmup_steps"),
    (
        {"evaluation_strategy": "steps", "eval_strategy": "epoch"},
        r"evaluation_strategy='steps' and eval_strategy='epoch'",
    ),
    ({"evaluation_strategy": "sometimes"}, r"evaluation_strategy: 'sometimes' is not a valid IntervalStrategy"),
    (
        {"group_by_length": True, "train_sampling_strategy": "sequential"},
        r"group_by_length=True conflicts with train_sampling_strategy='sequential'",
    ),
]


@pytest.mark.parametrize("kwargs, message", REFUSED_LEGACY, ids=repr)
def test_4x_values_we_cannot_honour_are_refused(kwargs, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match=message):
            TrainingArguments(**kwargs)


REFUSED = [
    ({"push_to_hub": True}, r"`push_to_hub=True` is not supported .*no hub here"),
    ({"push_to_hub": True, "hub_model_id": "me/model"}, r"`push_to_hub=True` is not supported"),
    ({"parallelism_config": {"cp_size": 2}}, r"parallelism_config.cp_size=2: context parallelism is not supported"),
    ({"debug": "tpu_metrics_debug"}, r"`debug=\['tpu_metrics_debug'\]` is not supported .* no TPUs"),
    ({"fsdp": True, "fsdp_config": {"xla": True}}, r"`fsdp_config\['xla'\]=True` is not supported"),
]


@pytest.mark.parametrize("kwargs, message", REFUSED, ids=repr)
def test_unsupported_settings_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainingArguments(**kwargs)


def test_trackio_fields_are_accepted_like_hf():
    # HF's own TrackioCallback reads them (report_to="trackio"); without a Space id trackio logs locally.
    kwargs = dict(project="p", trackio_space_id="me/space", trackio_bucket_id="me/bucket",
                  trackio_static_space_id=False)
    ours = TrainingArguments(**kwargs).to_dict()
    transformers = pytest.importorskip("transformers")
    hf = transformers.TrainingArguments(**kwargs).to_dict()
    assert {k: ours[k] for k in kwargs} == {k: hf[k] for k in kwargs} == kwargs


def test_hub_fields_without_push_are_accepted_like_hf():
    args = TrainingArguments(hub_model_id="me/model", hub_strategy="end", hub_private_repo=True)
    assert args.hub_model_id == "me/model"
    assert args.push_to_hub is False


def test_set_push_to_hub_is_refused():
    with pytest.raises(ValueError, match=r"set_push_to_hub\(model_id='me/model'\) is not supported .*no hub here"):
        TrainingArguments().set_push_to_hub("me/model")


def test_gradient_checkpointing_alias_warns_like_hf():
    with pytest.warns(FutureWarning, match="gradient_checkpointing"):
        transformers.TrainingArguments(gradient_checkpointing=True)
    with pytest.warns(FutureWarning, match=r"`gradient_checkpointing` is deprecated.*activation_checkpointing"):
        args = TrainingArguments(gradient_checkpointing=True)
    assert args.activation_checkpointing is args.gradient_checkpointing is True


@pytest.mark.parametrize(
    "kwargs",
    [{"evaluation_strategy": "epoch"}, {"gradient_checkpointing": True}, {"warmup_ratio": 0.1, "warmup_steps": 3}],
    ids=repr,
)
def test_warnings_point_at_the_caller(kwargs):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        TrainingArguments(**kwargs)
    assert record and all(item.filename == __file__ for item in record)

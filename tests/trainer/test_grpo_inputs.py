"""Every input TRL 1.16's `GRPOTrainer` trains on, given to `STAPOTrainer` as well: each is trained by both or refused
by both. The product's early checks ([`stapo_trl.data`], `ProductTrainerMixin.__init__`) must never refuse
what `GRPOTrainer` accepts: environments whose `reset` supplies the prompt (datasets without a `prompt` column), tools,
a `rollout_func`, iterable datasets, multimodal prompts, several eval datasets."""

import os
import warnings
from pathlib import Path

import pytest
import torch
import trl
from datasets import Dataset
from transformers import AutoTokenizer

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.data import check_prompt_column, check_reward_columns


os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory and rollout_func are experimental


class Counter:
    """An environment that owns its reward: a counter the model may increment with a tool."""

    def reset(self, **kwargs):
        self.value = 0
        return "Count to three."

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: how much to add.

        Returns:
            The counter's new value.
        """
        self.value += step
        return self.value

    def get_reward(self) -> float:
        return float(self.value == 3)


class Echo:
    """An environment without a reward of its own, whose `reset` adds nothing to the prompt."""

    def reset(self, **kwargs):
        return None

    def echo(self, text: str) -> str:
        """Repeat a text.

        Args:
            text: the text to repeat.

        Returns:
            The same text.
        """
        return text


def length_reward(completions, **kwargs):
    return [float(len(str(c))) for c in completions]


def topic_reward(completions, topic, **kwargs):
    return [float(t == "a") for t in topic]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor.
        b: the second factor.

    Returns:
        The product.
    """
    return a * b


def fixed_rollout(prompts, trainer):
    """A `rollout_func` that generates nothing: every completion is the same three tokens."""
    tokenizer = trainer.processing_class
    ids = tokenizer("1+1", add_special_tokens=False)["input_ids"]
    completion = tokenizer("=2", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return {
        "prompt_ids": [ids for _ in prompts],
        "completion_ids": [completion for _ in prompts],
        "logprobs": [[-1.0] * len(completion) for _ in prompts],
        "source": ["rollout"] * len(prompts),  # an extra field: forwarded to the reward functions
    }


def source_reward(completions, source, **kwargs):
    return [float(s == "rollout") for s in source]


CHAT = [{"role": "user", "content": "1+1"}]


@pytest.fixture(scope="module")
def tool_tokenizer(tiny_random_model_path):
    """The tiny model's tokenizer with TRL's Qwen3 template, which renders tool calls (tools and environments need
    one)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    return tokenizer


def outcome(trainer_class, model, tmp_path, *, config=None, **inputs) -> str:
    """`"trained"` after two optimizer steps (with a checkpoint at each: TRL writes the model card there), else the
    refusal as `"refused <type>"`."""
    config_class = STAPOConfig if trainer_class is STAPOTrainer else trl.GRPOConfig
    settings = dict(
        output_dir=str(tmp_path / trainer_class.__name__),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=6,
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        logging_steps=1,
        disable_tqdm=True,
    )
    settings.update(config or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            args = config_class(**settings)
            trainer = trainer_class(model=model, args=args, **inputs)
            trainer.train()
        except Exception as e:  # noqa: BLE001 (the type is the outcome)
            return f"refused {type(e).__name__}: {e}"
    assert trainer.state.global_step == 2
    return "trained"


def same_outcome(model, tmp_path, **inputs) -> str:
    grpo = outcome(trl.GRPOTrainer, model, tmp_path, **inputs)
    stapo = outcome(STAPOTrainer, model, tmp_path, **inputs)
    assert grpo.split()[0] == stapo.split()[0], f"GRPOTrainer: {grpo}\nSTAPOTrainer: {stapo}"
    return grpo


MULTI_ENVIRONMENT = {"counter": Counter, "echo": Echo}


@pytest.mark.parametrize(
    "case",
    [
        "environments-dict-no-prompt",  # TRL's own test_train_with_multiple_environments
        "environments-dict-no-prompt-owned-reward",  # TRL's test_environment_owned_reward_mixed_environments
        "environment-callable-no-prompt",
        "environment-callable-column-reward-no-prompt",
        "environment-callable-with-prompt",
        "environments-dict-with-prompt",
        "environment-callable-no-dataset",
    ],
)
def test_environments_train_as_in_grpo_trainer(tiny_random_model_path, tool_tokenizer, tmp_path, case):
    routed = {"environment": ["counter", "echo"] * 4}
    inputs = {
        "environments-dict-no-prompt": dict(
            train_dataset=Dataset.from_dict(routed), environment_factory=MULTI_ENVIRONMENT, reward_funcs=length_reward
        ),
        "environments-dict-no-prompt-owned-reward": dict(
            train_dataset=Dataset.from_dict(routed), environment_factory=MULTI_ENVIRONMENT
        ),
        "environment-callable-no-prompt": dict(
            train_dataset=Dataset.from_dict({"level": [1, 2] * 4}), environment_factory=Counter
        ),
        "environment-callable-column-reward-no-prompt": dict(
            train_dataset=Dataset.from_dict({"topic": ["a", "b"] * 4}),
            environment_factory=Counter,
            reward_funcs=topic_reward,
        ),
        "environment-callable-with-prompt": dict(
            train_dataset=Dataset.from_dict({"prompt": [CHAT] * 8}), environment_factory=Counter
        ),
        "environments-dict-with-prompt": dict(
            train_dataset=Dataset.from_dict({"prompt": [CHAT] * 8, **routed}), environment_factory=MULTI_ENVIRONMENT
        ),
        "environment-callable-no-dataset": dict(environment_factory=Counter),
    }[case]
    assert same_outcome(tiny_random_model_path, tmp_path, processing_class=tool_tokenizer, **inputs) == "trained"


def test_tools_train_as_in_grpo_trainer(tiny_random_model_path, tool_tokenizer, tmp_path):
    dataset = Dataset.from_dict({"prompt": [CHAT] * 8})
    result = same_outcome(
        tiny_random_model_path,
        tmp_path,
        processing_class=tool_tokenizer,
        train_dataset=dataset,
        reward_funcs=length_reward,
        tools=[multiply],
    )
    assert result == "trained"


@pytest.mark.parametrize("with_prompt", [True, False], ids=["prompt", "no-prompt"])
def test_rollout_func_as_in_grpo_trainer(tiny_random_model_path, tmp_path, with_prompt):
    # A reward argument filled by the rollout's extra field, not by a column. Without a `prompt` column (and no
    # environment) both refuse: TRL at its first step, the product at construction.
    dataset = Dataset.from_dict({"prompt": ["1+1"] * 8} if with_prompt else {"question": ["1+1"] * 8})
    result = same_outcome(
        tiny_random_model_path, tmp_path, train_dataset=dataset, reward_funcs=source_reward, rollout_func=fixed_rollout
    )
    assert result == "trained" if with_prompt else result.startswith("refused")


@pytest.mark.parametrize("which", ["train", "eval", "eval-dict"])
def test_iterable_datasets_as_in_grpo_trainer(tiny_random_model_path, tmp_path, which):
    dataset = Dataset.from_dict({"prompt": ["1+1", "2+2"] * 8, "topic": ["a", "b"] * 8})
    train = dataset.to_iterable_dataset() if which == "train" else dataset
    eval_dataset = {"eval": dataset.to_iterable_dataset(), "eval-dict": {"x": dataset.to_iterable_dataset()}}
    config = {"eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 4} if which != "train" else {}
    result = same_outcome(
        tiny_random_model_path,
        tmp_path,
        config=config,
        train_dataset=train,
        eval_dataset=eval_dataset.get(which),
        reward_funcs=topic_reward,
    )
    assert result == "trained"


def test_a_dict_of_eval_datasets_as_in_grpo_trainer(tiny_random_model_path, tmp_path):
    train = Dataset.from_dict({"prompt": ["1+1", "2+2"] * 4, "topic": ["a", "b"] * 4})
    evals = {"easy": train.select(range(4)), "hard": train.select(range(4, 8))}
    config = {"eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 4}
    result = same_outcome(
        tiny_random_model_path,
        tmp_path,
        config=config,
        train_dataset=train,
        eval_dataset=evals,
        reward_funcs=topic_reward,
    )
    assert result == "trained"


def test_tools_without_a_prompt_column_are_refused_by_both(tiny_random_model_path, tool_tokenizer, tmp_path):
    # Tools alone do not supply prompts (only an environment's reset does): TRL fails at its first step, the product
    # at construction.
    result = same_outcome(
        tiny_random_model_path,
        tmp_path,
        processing_class=tool_tokenizer,
        train_dataset=Dataset.from_dict({"question": [CHAT] * 8}),
        reward_funcs=length_reward,
        tools=[multiply],
    )
    assert result.startswith("refused")


@pytest.fixture(scope="module")
def tiny_vlm(tiny_random_model_path, tmp_path_factory):
    """A tiny LLaVA (a one-layer CLIP vision tower on the tiny Qwen3 text model, 129k parameters) and its processor
    with TRL's LLaVA-NeXT chat template, built offline: (folder, processor)."""
    from transformers import AutoProcessor, CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen3Config
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.llava.processing_llava import LlavaProcessor

    folder = tmp_path_factory.mktemp("tiny-vlm")
    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}),
        tokenizer=tokenizer,
        chat_template=(Path(trl.__file__).parent / "chat_templates" / "llava_next.jinja").read_text(),
        patch_size=14,
        vision_feature_select_strategy="full",
        num_additional_image_tokens=1,  # the CLS token, kept by the "full" strategy
    )
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    text = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder), AutoProcessor.from_pretrained(folder)


def _images(n: int) -> list:
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(0)
    return [Image.fromarray(rng.randint(0, 255, (28, 28, 3), dtype=np.uint8)) for _ in range(n)]


@pytest.mark.parametrize("case", ["image-column", "images-column", "no-chat-template"])
def test_multimodal_prompts_as_in_grpo_trainer(tiny_vlm, tmp_path, case):
    folder, processor = tiny_vlm
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "1+1"}]}]
    images = {"image": _images(8)} if case != "images-column" else {"images": [[image] for image in _images(8)]}
    if case == "no-chat-template":  # TRL fails at its first step, the product at construction
        processor = type(processor).from_pretrained(folder)
        processor.chat_template = None
    dataset = Dataset.from_dict({"prompt": [prompt] * 8, **images})
    result = same_outcome(
        folder, tmp_path, processing_class=processor, train_dataset=dataset, reward_funcs=length_reward
    )
    assert result == "trained" if case != "no-chat-template" else result.startswith("refused")


# The check functions themselves, for the inputs above.


@pytest.mark.parametrize(
    "dataset",
    [
        Dataset.from_dict({"environment": ["a", "b"]}),
        Dataset.from_dict({"level": [1, 2]}).to_iterable_dataset(),
        {"easy": Dataset.from_dict({"environment": ["a"]}), "hard": Dataset.from_dict({"prompt": ["x"]})},
    ],
    ids=["routing-column-only", "iterable", "dict-of-eval-datasets"],
)
def test_the_prompt_column_is_optional_with_an_environment(dataset):
    check_prompt_column(dataset, "train_dataset", prompt_optional=True)
    check_reward_columns(length_reward, dataset, "train_dataset")  # `prompts` is TRL's, not a column
    with pytest.raises(ValueError, match=r"Column 'prompt' not found .*environment_factory"):
        check_prompt_column(dataset, "train_dataset")  # without an environment, TRL fails on it at its first step


def test_an_empty_dataset_is_refused_even_with_an_environment():
    with pytest.raises(ValueError, match=r"Dataset 'train_dataset' is empty"):
        check_prompt_column(Dataset.from_dict({"environment": []}), "train_dataset", prompt_optional=True)

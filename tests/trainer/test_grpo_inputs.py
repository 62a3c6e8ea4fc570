"""Every input `GRPOTrainer` trains on, `STAPOTrainer` trains or refuses alike (environments, tools, rollout_func)."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import trl
from datasets import Dataset
from PIL import Image
from testing_utils import length_reward
from transformers import AutoTokenizer

from stapo_trl import STAPOConfig, STAPOTrainer


os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory and rollout_func are experimental
pytestmark = pytest.mark.filterwarnings("ignore")


class Counter:  # an environment that owns its reward
    def reset(self, **kwargs):
        self.value = 0
        return "Count to three."

    def increment(self, step: int) -> int:
        """Add to the counter.\n\nArgs:\n    step: how much to add."""
        self.value += step
        return self.value

    def get_reward(self) -> float:
        return float(self.value == 3)


class Echo:  # no reward of its own; its reset adds nothing to the prompt
    def reset(self, **kwargs):
        return None

    def echo(self, text: str) -> str:
        """Repeat a text.\n\nArgs:\n    text: the text to repeat."""
        return text


def topic_reward(completions, topic, **kwargs):
    return [float(t == "a") for t in topic]


def multiply(a: int, b: int) -> int:
    """Multiply two integers.\n\nArgs:\n    a: the first factor.\n    b: the second factor."""
    return a * b


def fixed_rollout(prompts, trainer):  # generates nothing: every completion is the same three tokens
    tokenizer = trainer.processing_class
    ids = tokenizer("1+1", add_special_tokens=False)["input_ids"]
    completion = tokenizer("=2", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    n = len(prompts)  # "source": an extra field, forwarded to the reward functions
    return {"prompt_ids": [ids] * n, "completion_ids": [completion] * n, "logprobs": [[-1.0] * len(completion)] * n,
            "source": ["rollout"] * n}  # fmt: skip


def source_reward(completions, source, **kwargs):
    return [float(s == "rollout") for s in source]


def outcome(trainer_class, model, tmp_path, *, config=None, **inputs) -> str:  # "trained" (a step, a save), "refused"
    config_class = STAPOConfig if trainer_class is STAPOTrainer else trl.GRPOConfig
    settings = dict(output_dir=str(tmp_path / trainer_class.__name__), use_cpu=True, bf16=False, report_to=[],
                    per_device_train_batch_size=4, num_generations=2, max_completion_length=6, max_steps=1,
                    save_strategy="steps", save_steps=1, logging_steps=1, disable_tqdm=True)  # fmt: skip
    try:
        trainer = trainer_class(model=model, args=config_class(**settings | (config or {})), **inputs)
        trainer.train()
    except Exception as e:  # noqa: BLE001 (the type is the outcome)
        return f"refused {type(e).__name__}: {e}"
    assert trainer.state.global_step == 1
    return "trained"


D, ROUTED, CHAT = Dataset.from_dict, {"environment": ["counter", "echo"] * 4}, [{"role": "user", "content": "1+1"}]
EVALS = {"eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 4}
TOPICS = D({"prompt": ["1+1", "2+2"] * 8, "topic": ["a", "b"] * 8})
# case: (inputs, whether both train it). Without a prompt column (nor environment) both refuse: TRL at its first step,
# the library at construction. Tools alone supply no prompts (an environment's reset does). The first two cases are
# TRL's test_train_with_multiple_environments and test_environment_owned_reward_mixed_environments.
ENV, MULTI_ENV = (dict(environment_factory=f, chat_tools=True) for f in (Counter, {"counter": Counter, "echo": Echo}))
ROLLOUT = dict(reward_funcs=source_reward, rollout_func=fixed_rollout)
CASES = {
    "environments-dict-no-prompt": (dict(train_dataset=D(ROUTED), reward_funcs=length_reward, **MULTI_ENV), True),
    "environments-dict-no-prompt-owned-reward": (dict(train_dataset=D(ROUTED), **MULTI_ENV), True),
    "environment-callable-no-prompt": (dict(train_dataset=D({"level": [1, 2] * 4}), **ENV), True),
    "environment-callable-column-reward-no-prompt": (dict(train_dataset=D({"topic": ["a", "b"] * 4}),
                                                          reward_funcs=topic_reward, **ENV), True),
    "environment-callable-with-prompt": (dict(train_dataset=D({"prompt": [CHAT] * 8}), **ENV), True),
    "environments-dict-with-prompt": (dict(train_dataset=D({"prompt": [CHAT] * 8, **ROUTED}), **MULTI_ENV), True),
    "environment-callable-no-dataset": (ENV, True),
    "tools": (dict(train_dataset=D({"prompt": [CHAT] * 8}), reward_funcs=length_reward, tools=[multiply]), True),
    "tools-no-prompt": (dict(train_dataset=D({"question": [CHAT] * 8}), reward_funcs=length_reward,
                             tools=[multiply]), False),
    "rollout-func": (dict(train_dataset=D({"prompt": ["1+1"] * 8}), **ROLLOUT), True),  # a reward fed by the rollout
    "rollout-func-no-prompt": (dict(train_dataset=D({"question": ["1+1"] * 8}), **ROLLOUT), False),
    "iterable-train": (dict(train_dataset=TOPICS.to_iterable_dataset(), reward_funcs=topic_reward), True),
    "iterable-eval": (dict(train_dataset=TOPICS, eval_dataset=TOPICS.to_iterable_dataset(), reward_funcs=topic_reward,
                           config=EVALS), True),
    "iterable-eval-dict": (dict(train_dataset=TOPICS, eval_dataset={"x": TOPICS.to_iterable_dataset()},
                                reward_funcs=topic_reward, config=EVALS), True),
    "eval-dict": (dict(train_dataset=TOPICS, eval_dataset={"easy": TOPICS.select(range(4)),
                       "hard": TOPICS.select(range(4, 8))}, reward_funcs=topic_reward, config=EVALS), True),
}  # fmt: skip
FAST = {"rollout-func-no-prompt"}  # the rest train (~2 s each): slow


@pytest.mark.parametrize("case", [c if c in FAST else pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_grpo_trainers_inputs_train_or_are_refused_as_in_grpo_trainer(tiny_random_model_path, tmp_path, case):
    inputs, trains = dict(CASES[case][0]), CASES[case][1]
    if inputs.pop("chat_tools", False) or "tools" in inputs:  # tools, an environment's too: TRL's Qwen3 template
        inputs["processing_class"] = tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
        tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    grpo, stapo = (outcome(cls, tiny_random_model_path, tmp_path, **inputs) for cls in (trl.GRPOTrainer, STAPOTrainer))
    assert grpo.split()[0] == stapo.split()[0], f"GRPOTrainer: {grpo}\nSTAPOTrainer: {stapo}"
    assert (grpo == "trained") == trains, grpo


@pytest.fixture(scope="module")
def tiny_vlm(tiny_random_model_path, tmp_path_factory):  # a tiny LLaVA and its processor: (folder, processor)
    from transformers import AutoProcessor, CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen3Config
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.llava.processing_llava import LlavaProcessor

    folder = tmp_path_factory.mktemp("tiny-vlm")
    tokenizer = AutoTokenizer.from_pretrained(tiny_random_model_path)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    template = (Path(trl.__file__).parent / "chat_templates" / "llava_next.jinja").read_text()
    size, crop = {"shortest_edge": 28}, {"height": 28, "width": 28}  # one additional image token: the CLS token
    processor = LlavaProcessor(image_processor=CLIPImageProcessorPil(size=size, crop_size=crop), tokenizer=tokenizer,
                               chat_template=template, patch_size=14, vision_feature_select_strategy="full",
                               num_additional_image_tokens=1)  # fmt: skip
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=28, patch_size=14)  # fmt: skip
    text = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                       tie_word_embeddings=True)  # fmt: skip
    config = LlavaConfig(vision_config=vision, text_config=text, vision_feature_layer=-1, tie_word_embeddings=True,
                         image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                         vision_feature_select_strategy="full")  # fmt: skip
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder), AutoProcessor.from_pretrained(folder)


@pytest.mark.slow  # trains a tiny vision-language model
@pytest.mark.parametrize("case", ["image-column", "images-column", "no-chat-template"])
def test_multimodal_prompts_as_in_grpo_trainer(tiny_vlm, tmp_path, case):
    folder, processor = tiny_vlm
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "1+1"}]}]
    pictures = [Image.fromarray(a) for a in np.random.RandomState(0).randint(0, 255, (8, 28, 28, 3), dtype=np.uint8)]
    images = {"image": pictures} if case != "images-column" else {"images": [[image] for image in pictures]}
    if case == "no-chat-template":  # TRL fails at its first step, the library at construction
        processor = type(processor).from_pretrained(folder)
        processor.chat_template = None
    inputs = dict(processing_class=processor, train_dataset=Dataset.from_dict({"prompt": [prompt] * 8, **images}),
                  reward_funcs=length_reward)  # fmt: skip
    grpo, stapo = (outcome(cls, folder, tmp_path, **inputs) for cls in (trl.GRPOTrainer, STAPOTrainer))
    assert grpo.split()[0] == stapo.split()[0] == ("trained" if case != "no-chat-template" else "refused"), stapo

from datasets import Dataset

from stapo_trl import STAPOConfig as GRPOConfig  # was: from trl import GRPOConfig, GRPOTrainer
from stapo_trl import STAPOTrainer as GRPOTrainer
from stapo_trl.rewards import math_accuracy_reward  # 1.0 when the last \boxed{} equals `solution`, else 0.0


# Each prompt ends with the instruction the model was trained with (the paper's); without it, no \boxed{}: reward 0.
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
pairs = [(a, b) for a in range(10, 100, 9) for b in range(11, 100, 8)]  # 10 x 12 two-digit additions
dataset = Dataset.from_list(
    [{"prompt": [{"role": "user", "content": f"{a}+{b}\n{INSTRUCTION}"}], "solution": str(a + b)} for a, b in pairs]
)

trainer = GRPOTrainer(
    model="builtin:tiny-math",  # a 144k-parameter Qwen3, built offline on first use; on GPUs "Qwen/Qwen3-1.7B-Base"
    reward_funcs=math_accuracy_reward,
    args=GRPOConfig(  # paper defaults (τ_p 0.002, q 0.75, DAPO loss); sets use_cpu=True, bf16=False without a GPU
        output_dir="outputs/python-api",  # metrics.jsonl, spurious_tokens.jsonl: `stapo-plot outputs/python-api`
        max_steps=20,
        logging_steps=2,
        per_device_train_batch_size=16,  # completions per step: 2 prompts x num_generations 8
        num_generations=8,
        max_completion_length=48,
        learning_rate=1e-4,
        report_to="none",
    ),
    train_dataset=dataset,
)
trainer.train()

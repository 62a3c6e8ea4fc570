"""`STAPOTrainer` in a script behaves as `GRPOTrainer`: console, signals, warning filters, Hub attempts, import."""

import signal
import socket
import subprocess
import sys
import warnings

import huggingface_hub.constants
import huggingface_hub.utils._http
import pytest
import trl
from testing_utils import PROMPTS, length_reward, subprocess_env
from transformers import TrainerCallback

import stapo_trl.core
from stapo_trl import STAPOTrainer


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def _config(tmp_path, name, **overrides):
    return trl.GRPOConfig(**dict(output_dir=str(tmp_path / name), max_steps=1, logging_steps=1, use_cpu=True,
        bf16=False, per_device_train_batch_size=8, num_generations=4, max_completion_length=8, report_to="none",
        save_strategy="no") | overrides)  # fmt: skip


def test_the_trainer_keeps_grpo_trainers_console_signals_filters_warns_at_the_users_line_and_opens_no_connection(
        tiny_random_model_path, tmp_path, monkeypatch):  # fmt: skip
    filters, handlers, seen, consoles = list(warnings.filters), {s: signal.getsignal(s) for s in SIGNALS}, {}, []

    class Observer(TrainerCallback):  # what the process looks like at a step end
        def on_step_end(self, args, state, control, **kwargs):
            seen[args.output_dir] = ({s: signal.getsignal(s) for s in SIGNALS}, list(warnings.filters))

    for trainer_class in (trl.GRPOTrainer, STAPOTrainer):
        trainer = trainer_class(tiny_random_model_path, length_reward, args=_config(tmp_path, trainer_class.__name__),
                                train_dataset=PROMPTS, callbacks=[Observer()])  # fmt: skip
        consoles.append([type(callback) for callback in trainer.callback_handler.callbacks])
        trainer.train()
    assert consoles[0] == consoles[1]  # transformers' ProgressCallback / PrinterCallback, nothing swapped
    (grpo_handlers, grpo_filters), (stapo_handlers, stapo_filters) = seen.values()
    assert stapo_handlers == grpo_handlers == handlers and stapo_filters == grpo_filters  # nothing of ours
    assert warnings.filters == filters and {s: signal.getsignal(s) for s in SIGNALS} == handlers
    plain = "GRPOConfig has no s2t_prob_threshold"  # the construction line of a plain GRPOConfig; beta: said once
    for trainer_class, overrides, words in [(STAPOTrainer, {}, plain), (stapo_trl.core.STAPOTrainer, {}, plain),
                                            (STAPOTrainer, {"beta": 0.04}, "lose their KL penalty")]:  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer_class(tiny_random_model_path, length_reward, args=_config(tmp_path, "warn", **overrides),
                          train_dataset=PROMPTS)  # fmt: skip
        (warning,) = [w for w in caught if words in str(w.message)]
        assert warning.filename == __file__, (warning.filename, str(warning.message))
    attempts = []  # an uncached Hub id, no Hub: the same attempts and error as GRPOTrainer (each resolves the host)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: attempts.append(host) or (_ for _ in ()).throw(
        socket.gaierror(socket.EAI_NONAME, "no network in this test")))  # fmt: skip
    monkeypatch.setattr(huggingface_hub.utils._http.time, "sleep", lambda seconds: None)  # its retries' back-off
    errors = []  # the first construction in a process asks once more (a cached lookup): GRPOTrainer goes first twice
    for trainer_class in (trl.GRPOTrainer, trl.GRPOTrainer, STAPOTrainer):
        attempts.clear()
        with pytest.raises(OSError) as raised:
            trainer_class("not-a-cached-org/no-model", length_reward, args=_config(tmp_path, "hub"),
                          train_dataset=PROMPTS)  # fmt: skip
        errors.append((type(raised.value), len(attempts)))
    assert errors[1] == errors[2] and errors[2][1] > 0, errors  # both asked the Hub, as often


@pytest.mark.slow  # a new Python process: ~10 s of imports
def test_importing_the_trainer_loads_no_deepspeed_and_at_most_3000_lines_of_the_package():
    code = ("import sys\nfrom stapo_trl import STAPOConfig, STAPOTrainer\n"
            "mods = [m for n, m in sys.modules.items() if n.startswith('stapo_trl') and getattr(m, '__file__', 0)]\n"
            "print(sum(len(open(m.__file__).read().splitlines()) for m in mods), 'deepspeed' in sys.modules, "
            "'matplotlib' in sys.modules, 'math_verify' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env()).stdout
    lines, *loaded = out.split()
    assert loaded == ["False", "False", "False"] and int(lines) <= 3000, out

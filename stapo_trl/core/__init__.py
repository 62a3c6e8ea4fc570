# Copyright 2026 The stapo_trl Authors. All rights reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""[STAPO](https://huggingface.co/papers/2602.15620) for TRL: GRPO whose loss silences rare spurious tokens.

`s2t.py` holds the rule as tensor maths, `stapo_config.py` the config and `stapo_trainer.py` the trainer. This folder
imports torch, accelerate and trl only and writes no files.
"""

from .s2t import S2TResult, s2t_mask
from .stapo_config import STAPOConfig
from .stapo_trainer import STAPOTrainer


__all__ = ["S2TResult", "STAPOConfig", "STAPOTrainer", "s2t_mask"]

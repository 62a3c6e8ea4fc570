r"""The one answer grader of `stapo_trl`: training reward and benchmark evaluation both call it.

A completion is graded by its LAST complete `\boxed{...}` (or `\fbox{...}`) against a gold answer, with
[math-verify](https://github.com/huggingface/Math-Verify) (`parse` + `verify`) deciding mathematical equivalence,
as in the [STAPO](https://huggingface.co/papers/2602.15620) recipe (Sec. 4.1: binary rule-based reward, final
answer in `\boxed{}`).

Accepted formats (completion side):

- `\boxed{...}` / `\fbox{...}` with nested braces (`\boxed{\frac{1}{3}}`), also the brace-less `\boxed 5`;
  several boxes: the last one wins; the last box unterminated (a truncated generation) or no box at all: wrong.
- Inside the box: LaTeX or plain expressions, optionally wrapped in `$...$`, `\(...\)`, `\[...\]`; `\text{13}`,
  `\textbf{13}`, `\mathrm{13}` around a number; leading zeros (`025`); integer-valued floats (`27.0`); thousands
  separators (`1,000` only where the gold is a single number); trailing periods; units in `\text{ km}`.

Accepted formats (gold side): `str`, `int`, `float` (`27.0` == `27`), a string wrapped in `$...$` or in
`\boxed{}` (verl ground truths), a Python-style number (`4.5e33`, `-1./3`), numpy-style functions
(`np.arcsin(10/13)`, as in some Minerva copies), and multi-answer golds:

- a `list`/`tuple` of answers (OlympiadBench `final_answer`), or a string of several `$...$` groups separated by
  commas (`"$69$,$84$"`, the OlympiadBench verl copy): ALL parts must match, in ANY order (the completion's last
  box is split at top-level commas; if the part count differs, the last k boxes are used when there are k of them;
  otherwise the whole box is compared with the joined gold as a set, which math-verify compares order-free).

A gold that math-verify cannot turn into a SymPy object never gives credit (the result carries
`error="gold unparseable: ..."`), even when the completion repeats it verbatim.

Equality of values (after math-verify has parsed both sides):

- Both sides exact (integers, rationals, factorials, powers, radicals, pi, e, no decimal point anywhere): rationals
  are compared as fractions, other closed forms to `EXACT_DIGITS` (40) significant digits. There is no absolute
  tolerance: `1/2006!` is not `1/2004!`, `2^{-100}` is not `2^{-101}`, `2^{200}+1` is not `2^{200}`.
- A decimal on either side: relative tolerance `DECIMAL_REL_TOL` (5e-6, about six significant digits):
  `27.0` == `27`, `0.333333` == `1/3` and `3.14159` == `pi`, but `0.3333` != `1/3` and `1.2e-8` != `1.5e-8`.
- Tuples and matrices element by element with the same rules; everything else (sets, intervals, equations,
  expressions with variables, percentages) as math-verify decides, with `allow_set_relation_comp` on
  (`x > 3` == `(3, \infty)`).

Multiple choice: when the gold is an option letter A-E (`C`, `(C)`, `\text{(C)}`, `\textbf{C}`), the letter of the
answer decides (`\text{C: } 12`, `\textbf{(C)}\ 12`, `(c)`); an answer without a letter is wrong. Against any other
gold an option prefix is dropped and its value graded (`\textbf{(C)}\ 12` == `12`).

Upright constants and operators are read as what they write, on both sides: `\mathrm{e}`, `{\rm e}` (Euler's e),
`\mathrm{i}` (the imaginary unit letter), `\mathrm{d}` (a differential), `\operatorname{arcsin}`,
`\mathrm{sin}` (the function). Also read: repeating decimals (`0.\overline{3}`), thin spaces between digit groups
(`12\,345`), Unicode `°`, `π`, `∞`, `×`, `·`, `√`, `≤`, `≥`.

Fast paths (no SymPy): when both sides are plain integers (after the normalisation above) they are compared as
Python `int`s (the common case for AIME/AMC/DAPO); when the answer equals the gold up to whitespace, it is correct
as soon as the gold parses. Parsed golds are cached (an evaluation grades N samples against each gold).

Time bound: every `grade` / `is_correct` call (and so every reward value) returns within `GRADE_TIMEOUT_S` seconds
(2.0 by default, [`configure_grader`]) of wall time, on the main thread, on any other thread, in a thread pool or
inside an `async` reward; the only exception is the first call in a process, which also imports SymPy /
latex2sympy / math-verify once (1-2 s) before its bound starts. Three layers:

1. Refusal before evaluation: answers over `MAX_ANSWER_CHARS` characters, parsed expressions over `MAX_EXPR_NODES`
   nodes, and numbers whose exact evaluation needs more than `MAX_RESULT_DIGITS` digits (`10^{10^{10}}`,
   `2003^{2002^{2001}}`, `(10^7)!`, `\binom{10^9}{10^5}`: a big-integer power holds the GIL, so no thread timeout
   could stop it).
2. In-process (the default): on the main thread a `signal.setitimer` alarm interrupts the comparison at the bound;
   on other threads the comparison runs in a daemon thread that is abandoned at the bound (it finishes in the
   background; math-verify's own `signal.alarm` timeouts are off everywhere).
3. Optional worker processes (`configure_grader(processes=N)` or `STAPO_GRADER_PROCESSES=N`): parsing and
   verification run in N persistent child interpreters (started with `subprocess`, not `fork`: safe next to torch
   threads; they import this package alone, not torch) and one that overruns the bound is killed and replaced.

Refused, interrupted and killed comparisons are wrong, carry `error="timeout: ..."` and are counted in
`GRADER_STATS["timeouts"]` (and as `grading/timeout_ratio` by the reward); never correct.

Any exception inside math-verify makes the completion wrong and is reported in `GradeResult.error` and counted in
`GRADER_STATS`; `grade` never raises and never scores 1 on an error.

Modules, each importing only the ones before it (standard library and math-verify only, never torch):

- `extract.py`: the last `\boxed{}`; `choice.py`: multiple-choice letters; `normalize.py`: LaTeX normalisation and
  gold layouts ([`gold_parts`]);
- `bound.py`: `GRADE_TIMEOUT_S` and the in-process time bound; `verify.py`: math-verify parsing, size refusal, exact
  and decimal comparison; `workers.py`: the worker processes and [`configure_grader`];
- `api.py`: [`grade`], [`is_correct`], [`GradeResult`], `GRADER_STATS`.

This package re-exports the public API only. State that is rebound at run time lives in, and is read from, its
defining module: the bound `bound.GRADE_TIMEOUT_S` (set with [`configure_grader`]), the worker pool
`workers._POOL`, the limits of `verify` (`verify.MAX_ANSWER_CHARS`); patch a private function where it is defined
(`monkeypatch.setattr(grading.verify, "_verify", f)`).
"""

from __future__ import annotations

from .api import GRADER_STATS, GradeResult, grade, is_correct
from .choice import option_letter
from .extract import extract_boxed_answer
from .normalize import gold_parts, normalize_answer
from .workers import configure_grader


__all__ = [
    "GRADER_STATS",
    "GradeResult",
    "configure_grader",
    "extract_boxed_answer",
    "gold_parts",
    "grade",
    "is_correct",
    "normalize_answer",
    "option_letter",
]

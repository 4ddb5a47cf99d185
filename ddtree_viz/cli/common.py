"""What several subcommands share: their argument groups (models, decoding, chat, sampling), the checks made before
any model loads (settings, the sampler, output paths, the prompt), the decoding flags as options.DecodeSettings,
and loading the pair. Nothing here imports torch until a model is loaded."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from ..errors import InputError
from ..options import DEVICES, DRAFT_WEIGHTS, DTYPES, HEAD_WEIGHTS, MARGINAL, TREE_SCORINGS, DecodeSettings, number, whole_number


def check_output_path(path: str | Path, what: str) -> Path:
    """Refuse an output file that cannot be written, before the decode, bench or export that would fill it (a name
    the file system refuses, over 255 bytes, is a clear error too, not a traceback after the work)."""
    out = Path(path)
    folder = out.parent
    try:
        check_name_length(out, what)
        if out.is_dir():
            raise InputError(f"cannot write {what} {out}: it is a directory")
        if not folder.is_dir():
            why = "is not a folder" if os.path.lexists(folder) else "does not exist"  # /dev/null/x: it exists
            raise InputError(f"cannot write {what} {out}: {folder} {why}")
        if not os.access(folder, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
            raise InputError(f"cannot write {what} {out}: permission denied")
    except OSError as exc:
        raise InputError(f"cannot write {what} {out}: {exc.strerror or type(exc).__name__}") from None
    return out


def check_name_length(path: Path, what: str) -> None:
    """A file or folder name longer than the file system takes (NAME_MAX: 255 bytes on most) is refused by name."""
    size = len(os.fsencode(path.name))
    if size > 255:
        raise InputError(f"cannot write {what} {path}: its name is {size:,} bytes; file systems take at most 255")


# ------------------------------------------------------------------------------------------------------------
# Argument groups
# ------------------------------------------------------------------------------------------------------------


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", metavar="DIR|HUB_ID", help="target model (default: the embedded tiny Qwen3.5-style model)")
    g.add_argument("--draft", metavar="DIR|HUB_ID",
                   help="DFlash or DFlash2 drafter for the target, by its config's architectures (default: the "
                        "embedded one; with the embedded target, 'dflash2' names its embedded DFlash2 drafter)")
    g.add_argument("--dtype", default="float32", choices=DTYPES, help="default: float32")
    g.add_argument("--device", default="cpu", choices=DEVICES,
                   help="cpu, cuda (one GPU) or auto (all visible GPUs via accelerate); default: cpu")
    g.add_argument("--draft-weights", choices=DRAFT_WEIGHTS, default=None,
                   help="int4: the drafter's Linears quantized to 4 bits at load (symmetric, groups of 128). The "
                        "output stays the target's; only acceptance may change. On CUDA the weights stay packed (the "
                        "27B's DFlash drafter in 0.83 GiB, not 3.22: what a 24 GB card needs beside a 4-bit target)")
    g.add_argument("--head-weights", choices=HEAD_WEIGHTS, default=None,
                   help="int4 (symmetric, groups of 128) or fp8 (e4m3, 128x128 blocks): the target's lm_head quantized "
                        "at load. The target's function changes, so greedy and DDTree change together (and stay "
                        "equal); what it costs against the plain head: analyze --head-weights-b none. The 27B's head "
                        "in 0.61 GiB (int4) or 1.18 GiB (fp8), not 2.37")
    g.add_argument("--verbose", action="store_true", help="show transformers' log messages and progress bars")


def add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--budget", type=whole_number, default=32, help="draft tree nodes per round (default: 32)")
    g.add_argument("--max-new-tokens", type=whole_number, default=64, help="tokens to generate (default: 64)")
    g.add_argument("--block-size", type=whole_number, default=None,
                   help="drafter block: root + drafted depths (default: the drafter's own)")


def add_scoring_arg(p: argparse.ArgumentParser) -> None:
    """--tree-scoring: how DDTree scores a node (run, analyze; a trace records it, so export and replay read it)."""
    p.add_argument("--tree-scoring", default=MARGINAL, choices=TREE_SCORINGS,
                   help="how DDTree scores a node: marginal (default: the sum of the drafter's per-depth log-probs "
                        "along its path) or selector (a DFlash2 drafter's candidate selector: the sum of log_softmax "
                        "over its top-K of the pair scores S_t(parent's token, b))")


def add_chat_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("chat", "chat models (Qwen3.6-27B among them) and their drafters were trained on "
                                     "chat-formatted text: --chat sends the prompt through the tokenizer's chat template")
    g.add_argument("--chat", action="store_true",
                   help="apply the tokenizer's chat template: the prompt is the user's message (or the messages of a "
                        "JSON --prompt-file), then the assistant's turn is opened")
    g.add_argument("--system", metavar="TEXT", help="a system prompt, first in the conversation (with --chat)")
    g.add_argument("--thinking", choices=("on", "off"),
                   help="the template's thinking switch (enable_thinking, as in Qwen3/3.5/3.6 templates), with --chat; "
                        "default: the template's own default")


def add_sampling_args(p: argparse.ArgumentParser, several: bool = False) -> None:
    g = p.add_argument_group("sampling", "the target's choice at each position: greedy (temperature 0) or a sample "
                                         "drawn with noise keyed by (seed, position), so plain decoding and the tree "
                                         "walk still agree token for token (docs/SAMPLING.md)")
    if several:
        g.add_argument("--temperature", type=number, nargs="+", default=[0.0], metavar="T",
                       help="one or more temperatures, each measured on the same prompts (e.g. 0 0.7 1.0); "
                            "0 = greedy (default)")
    else:
        g.add_argument("--temperature", type=number, default=0.0, metavar="T", help="0 = greedy (default)")
    g.add_argument("--top-k", type=whole_number, default=0, metavar="K",
                   help="sample among the K most likely tokens only (default: 0, off)")
    g.add_argument("--top-p", type=number, default=1.0, metavar="P",
                   help="sample among the most likely tokens holding probability P (default: 1, off)")
    g.add_argument("--seed", type=whole_number, default=0, metavar="S", help="noise seed, 0..2^32-1 (default: 0)")


# ------------------------------------------------------------------------------------------------------------
# Checks and settings, before any model loads
# ------------------------------------------------------------------------------------------------------------


def check_settings(args) -> None:
    """Range checks that need no model, done before a (possibly long) model load: DecodeSettings' own (the one
    place they are written) and the sampler's."""
    DecodeSettings(budget=args.budget, max_new_tokens=args.max_new_tokens, block_size=args.block_size)
    for t in args.temperature if isinstance(args.temperature, list) else [args.temperature]:
        sampler(args, t)


def sampler(args, temperature: float):
    """The Sampler of the sampling flags at `temperature` (its own checks: top-k, top-p, seed)."""
    from ..engine.sampling import Sampler

    return Sampler(temperature, args.top_k, args.top_p, args.seed)


def decode_settings(args, **given) -> DecodeSettings:
    """The decoding flags as options.DecodeSettings: each field from the flag of its name where this subcommand
    has one, `given` for the rest (or instead)."""
    names = [f.name for f in dataclasses.fields(DecodeSettings)]
    return DecodeSettings(**{**{n: getattr(args, n) for n in names if hasattr(args, n)}, **given})


def prompt_spec(args, text: str | None = None, path: str | None = None):
    """The PromptSpec of one prompt given on the command line (text or file) with the chat options; checked
    before any model is loaded."""
    from ..engine.prompts import PromptSpec, check_spec, parse_thinking, spec_from_file

    options = dict(chat=args.chat, system=args.system, thinking=parse_thinking(args.thinking))
    if path is not None:
        return spec_from_file(path, **options)
    return check_spec(PromptSpec(text=text, **options))


def load_models(args, gpu: int | None = None):
    """The pair the model flags name, after the checks that need no model; transformers kept quiet unless
    --verbose. `gpu`: the CUDA device this process decodes on (one process of several)."""
    from ..engine.models import check_embedded, load_pair, quiet_transformers

    check_settings(args)
    quiet_transformers(args.verbose)
    if args.target is None:
        check_embedded(args.draft)
    if gpu is not None:
        import torch

        torch.cuda.set_device(gpu)
    return load_pair(args.target, args.draft, dtype=args.dtype, device=args.device,
                     draft_weights=getattr(args, "draft_weights", None),
                     head_weights=getattr(args, "head_weights", None))


def printable(text: str) -> str:
    """Model output may hold control characters (escape sequences included): show them as \\xNN."""
    return "".join(ch if ch in "\n\t" or ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)

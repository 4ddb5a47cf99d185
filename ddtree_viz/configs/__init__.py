"""Real model configs shipped as package data (no weights): Qwen3.6-27B's text model, its DFlash drafter, and
Qwen3.8-27B's DFlash2 drafter (the same target shapes)."""

from pathlib import Path

CONFIGS = Path(__file__).resolve().parent

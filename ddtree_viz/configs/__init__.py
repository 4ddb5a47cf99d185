"""Real model configs shipped as package data (no weights): Qwen3.6-27B's text model and its DFlash drafter."""

from pathlib import Path

CONFIGS = Path(__file__).resolve().parent

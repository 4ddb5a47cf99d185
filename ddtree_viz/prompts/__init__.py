"""Prompts shipped with the package: the prompt sets (README.md here) and the default prompts of `bench` and the
page."""

# A few lines of everyday code each: the embedded 8M-parameter target degenerates into repeating one word on
# a bare one-line prompt at a file's start ("def main(argv):" -> "main main main ..."), which drafts easily
# but is not the text anyone decodes. These prompts give it context; its continuations look like Python.
DEFAULT_PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n',
    "import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def read_config(path):\n    with open(path) as f:\n",
)

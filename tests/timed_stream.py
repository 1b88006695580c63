"""A stand-in for the cell's stdout/stderr that records when each piece of text arrived (live streaming tests)."""
import time


class TimedStream:
    def __init__(self):
        self.pieces = []

    def write(self, text):
        self.pieces.append((time.monotonic(), text))
        return len(text)

    def flush(self):
        pass

    def text(self):
        return "".join(t for _, t in self.pieces)

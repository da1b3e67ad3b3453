"""The pieces of a training step the trainer calls: micro-batches, compiled layers, expert
bias and counts, host-read counting, agreement among ranks."""

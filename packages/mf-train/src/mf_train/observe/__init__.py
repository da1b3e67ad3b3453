"""The training loop's hook points (callbacks) and what it measures: step times, throughput,
FLOPs, memory, profiles, the validation loss."""

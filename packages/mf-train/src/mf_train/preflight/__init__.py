"""What is decided and checked before any rank starts: the job's plan, what the trainer does
with every configuration field, the input files and the run's directories."""

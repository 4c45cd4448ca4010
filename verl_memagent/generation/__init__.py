"""Token-in/token-out generation on transformers, device-neutral: the `hf` rollout backend's engine and the
in-process model of `verl-memagent eval` (`generator.HFGenerator`), with its requests' rules, per-row
sampling, continuous batching and prefix cache. Imports nothing heavy until a module is asked for."""

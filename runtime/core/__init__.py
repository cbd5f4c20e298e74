"""The engine core: what one step of the runtime does with the scheduler, the engines and the sampler."""

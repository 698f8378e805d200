"""Pass instances with options, named by qualified name in vLLM's ``inductor_passes``
(the README's route for options): ``"vllm_passes.kda_pass_forced"``."""

import kda_inductor

kda_pass_forced = kda_inductor.VllmPostGradPass(force=True)

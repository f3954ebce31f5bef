"""Measurements that write the layer profile the C++ planner plans from (layer_profile: the
"stowage-layer-profile" format):

  profile      the user's torch layers, each run alone on the activations a sample input
               produces (profile_layers, also stowage.profile_layers); its command line,
               `python -m stowage.measure.profile --hf CONFIG`, measures a transformers model
  hf_profile   a Hugging Face transformers model of a config.json on fake CPU tensors at its
               real widths (profile_hf), from the parts it names: op work by class (op_work),
               live bytes (live_bytes), the model (hf_model), one logged step (hf_trace) and its
               figures (hf_step), loops folded (hf_fold), the fit in the sequence length (hf_fit)

Nothing is imported here: each module is imported by its name, and this package needs torch
where the package above it does not.
"""

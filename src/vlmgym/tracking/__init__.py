"""MLflow: one run per stage (stage_runs), one parent run per pipeline (pipeline_run), runs of killed stages
closed or resumed (run_recovery), the exported model as a pyfunc model (pyfunc_model) in the model registry
(model_registry)."""

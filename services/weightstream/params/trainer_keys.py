"""Where each key of ModelZoo's ``trainer:`` layout lands in the legacy layout: the tables that
``trainer_layout`` translates by and the params reference page shows."""

from __future__ import annotations

__all__ = ["HOMES", "INIT_KEYS", "PLAIN"]

# trainer section -> {key: legacy path}; a value of None is a whole legacy section
PLAIN: dict[str, dict[str, str]] = {
    "loop": {
        "max_steps": "runconfig.max_steps",
        "eval_frequency": "runconfig.eval_frequency",
        "eval_steps": "runconfig.eval_steps",
        "grad_accum_steps": "optimizer.grad_accum_steps",
    },
    "checkpoint": {
        "steps": "runconfig.checkpoint_steps",
        "save_initial_checkpoint": "runconfig.save_initial_checkpoint",
        "autoload_last_checkpoint": "runconfig.autoload_last_checkpoint",
        "disable_strict_checkpoint_loading": "runconfig.disable_strict_checkpoint_loading",
    },
    "logging": {
        "log_steps": "runconfig.log_steps",
        "log_level": "runconfig.log_level",
        "wsc_log_level": "runconfig.wsc_log_level",
        "enable_act_frequency": "runconfig.enable_act_frequency",
    },
    "precision": {
        "enabled": "model.mixed_precision",
        "fp16_type": "model.fp16_type",
        "precision_opt_level": "runconfig.precision_opt_level",
        "max_gradient_norm": "optimizer.max_gradient_norm",
        "max_gradient_value": "optimizer.max_gradient_value",
        "loss_scaling_factor": "optimizer.loss_scaling_factor",
        "initial_loss_scale": "optimizer.initial_loss_scale",
        "steps_per_increase": "optimizer.steps_per_increase",
        "min_loss_scale": "optimizer.min_loss_scale",
        "max_loss_scale": "optimizer.max_loss_scale",
        "log_loss_scale": "optimizer.log_summaries",
    },
    "backend": {
        "backend_type": "runconfig.target_device",
        "compile_dir": "runconfig.compile_dir",
        "compile_only": "runconfig.compile_only",
        "validate_only": "runconfig.validate_only",
        "enable_distributed": "runconfig.enable_distributed",
        "main_process_id": "runconfig.main_process_id",
        "dist_backend": "runconfig.dist_backend",
        "init_method": "runconfig.init_method",
        "sync_batchnorm": "runconfig.sync_batchnorm",
    },
    "cluster_config": {
        "num_csx": "runconfig.num_csx",
        "max_wgt_servers": "runconfig.num_wgt_servers",
        "max_act_per_csx": "runconfig.num_act_servers",
        "num_workers_per_csx": "runconfig.num_workers_per_csx",
        "mgmt_address": "runconfig.mgmt_address",
        "mgmt_namespace": "runconfig.mgmt_namespace",
        "credentials_path": "runconfig.credentials_path",
        "mount_dirs": "runconfig.mount_dirs",
        "python_paths": "runconfig.python_paths",
        "cbcore_image": "runconfig.cbcore_image",
        "job_labels": "runconfig.job_labels",
        "job_priority": "runconfig.job_priority",
        "job_time_sec": "runconfig.job_time_sec",
        "disable_version_check": "runconfig.disable_version_check",
    },
}
# the trainer keys outside PLAIN's tables -> where each lands (the page of params keys shows these)
HOMES: dict[str, str] = {
    "trainer.init.model": "model (the whole section, its keys as in the legacy layout)",
    "trainer.init.sparsity": "sparsity (the whole section)",
    "trainer.init.model_dir": "runconfig.model_dir",
    "trainer.init.seed": "runconfig.seed",
    "trainer.init.optimizer": "optimizer: {Name: {settings}}, Name as optimizer_type; lr is a constant "
    "learning_rate unless schedulers are given",
    "trainer.init.schedulers": "optimizer.learning_rate: one scheduler, or a SequentialLR of pieces "
    "(milestones: the running sums of the pieces' total_iters)",
    "trainer.init.callbacks": "each {Name: {settings}} used, reported as not applicable, or refused",
    "trainer.init.loggers": "each {Name: {settings}} reported as not applicable (an unknown name is an "
    "error)",
    "trainer.init.weightstream": "runconfig: weightstream's own keys, which ModelZoo has no place for",
    "trainer.fit.train_dataloader": "train_input (the whole section)",
    "trainer.fit.val_dataloader": "eval_input (the whole section; a list of one is taken)",
    "trainer.fit.ckpt_path": "runconfig.checkpoint_path",
    "trainer.validate": "reported as not applicable: weightstream evaluates during training",
    "trainer.validate_all": "reported as not applicable: weightstream evaluates during training",
}
INIT_KEYS = (
    "backend",
    "model_dir",
    "seed",
    "model",
    "optimizer",
    "schedulers",
    "precision",
    "sparsity",
    "loop",
    "checkpoint",
    "logging",
    "callbacks",
    "loggers",
    "weightstream",
)

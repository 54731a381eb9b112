CREATE TABLE `sandboxes` (
	`id` text PRIMARY KEY NOT NULL,
	`template_id` text NOT NULL,
	`alias` text,
	`state` text NOT NULL,
	`cpu_count` integer NOT NULL,
	`memory_mb` integer NOT NULL,
	`disk_size_mb` integer NOT NULL,
	`envd_version` text NOT NULL,
	`envd_access_token` text,
	`traffic_access_token` text,
	`metadata` text NOT NULL,
	`env_vars` text NOT NULL,
	`auto_pause` integer NOT NULL,
	`auto_resume` integer NOT NULL,
	`allow_internet_access` integer,
	`network` text,
	`endpoint` text,
	`runtime_state` text,
	`error` text,
	`created_at` integer NOT NULL,
	`started_at` integer NOT NULL,
	`end_at` integer NOT NULL,
	`updated_at` integer NOT NULL
);
--> statement-breakpoint
CREATE INDEX `sandboxes_state_idx` ON `sandboxes` (`state`);--> statement-breakpoint
CREATE INDEX `sandboxes_started_idx` ON `sandboxes` (`started_at`);
CREATE TABLE `sandbox_logs` (
	`seq` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`sandbox_id` text NOT NULL,
	`at` integer NOT NULL,
	`level` integer NOT NULL,
	`source` text NOT NULL,
	`message` text NOT NULL,
	`fields` text NOT NULL
);
--> statement-breakpoint
CREATE INDEX `sandbox_logs_at_idx` ON `sandbox_logs` (`sandbox_id`,`at`);--> statement-breakpoint
CREATE INDEX `sandbox_logs_seq_idx` ON `sandbox_logs` (`sandbox_id`,`seq`);

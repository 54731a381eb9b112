CREATE TABLE `event_webhooks` (
	`id` text PRIMARY KEY NOT NULL,
	`name` text NOT NULL,
	`url` text NOT NULL,
	`events` text NOT NULL,
	`enabled` integer NOT NULL,
	`secret` text NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL
);
--> statement-breakpoint
CREATE TABLE `sandbox_events` (
	`seq` integer PRIMARY KEY AUTOINCREMENT NOT NULL,
	`id` text NOT NULL,
	`sandbox_id` text NOT NULL,
	`type` text NOT NULL,
	`at` integer NOT NULL,
	`body` text NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX `sandbox_events_id_unique` ON `sandbox_events` (`id`);--> statement-breakpoint
CREATE INDEX `sandbox_events_sandbox_idx` ON `sandbox_events` (`sandbox_id`,`seq`);--> statement-breakpoint
CREATE INDEX `sandbox_events_at_idx` ON `sandbox_events` (`at`);--> statement-breakpoint
CREATE TABLE `webhook_attempts` (
	`id` text PRIMARY KEY NOT NULL,
	`webhook_id` text NOT NULL,
	`event_id` text NOT NULL,
	`event_type` text NOT NULL,
	`sandbox_id` text NOT NULL,
	`status` text NOT NULL,
	`at` integer NOT NULL,
	`duration_ms` integer NOT NULL,
	`request_url` text NOT NULL,
	`response_status` integer,
	`response_body` text,
	`error_class` text,
	`error_message` text,
	FOREIGN KEY (`webhook_id`) REFERENCES `event_webhooks`(`id`) ON UPDATE no action ON DELETE cascade
);
--> statement-breakpoint
CREATE INDEX `webhook_attempts_webhook_idx` ON `webhook_attempts` (`webhook_id`,`at`);--> statement-breakpoint
CREATE INDEX `webhook_attempts_event_idx` ON `webhook_attempts` (`webhook_id`,`event_id`);--> statement-breakpoint
CREATE TABLE `webhook_queue` (
	`webhook_id` text NOT NULL,
	`event_seq` integer NOT NULL,
	`attempts` integer DEFAULT 0 NOT NULL,
	`next_at` integer NOT NULL,
	PRIMARY KEY(`webhook_id`, `event_seq`),
	FOREIGN KEY (`webhook_id`) REFERENCES `event_webhooks`(`id`) ON UPDATE no action ON DELETE cascade,
	FOREIGN KEY (`event_seq`) REFERENCES `sandbox_events`(`seq`) ON UPDATE no action ON DELETE cascade
);

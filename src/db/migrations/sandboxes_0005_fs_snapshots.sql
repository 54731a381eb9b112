ALTER TABLE `sandboxes` ADD `auto_pause_memory` integer DEFAULT true NOT NULL;--> statement-breakpoint
ALTER TABLE `sandboxes` ADD `snapshot_kind` text;--> statement-breakpoint
UPDATE `sandboxes` SET `snapshot_kind` = 'memory' WHERE `state` = 'paused';

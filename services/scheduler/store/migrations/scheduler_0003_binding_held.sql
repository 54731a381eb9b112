ALTER TABLE `bindings` ADD `held` integer DEFAULT true NOT NULL;

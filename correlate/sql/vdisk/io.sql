-- Module vdisk.io: requests on the virtual disk (level 2).
-- INCLUDE block.requests

-- One row per request dispatched on the virtual disk (the loop device under
-- the guest FS, or virtio-blk in a guest); columns as block_requests.
-- @column * as block_requests
CREATE OR REPLACE VIEW vdisk_io AS
SELECT * FROM block_requests WHERE level = 'vdisk';

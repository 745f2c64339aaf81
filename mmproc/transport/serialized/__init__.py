"""Serialized replies: raw tensor bytes staged from the device (pinned, or page-locked messages), no pickle."""

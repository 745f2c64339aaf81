from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Transport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSPORT_AUTO: _ClassVar[Transport]
    TRANSPORT_SERIALIZED: _ClassVar[Transport]
    TRANSPORT_IPC: _ClassVar[Transport]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]

class CacheStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_STATUS_UNSPECIFIED: _ClassVar[CacheStatus]
    CACHE_MISS: _ClassVar[CacheStatus]
    CACHE_HIT: _ClassVar[CacheStatus]
    CACHE_COALESCED: _ClassVar[CacheStatus]
    CACHE_BYPASS: _ClassVar[CacheStatus]
TRANSPORT_AUTO: Transport
TRANSPORT_SERIALIZED: Transport
TRANSPORT_IPC: Transport
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_BFLOAT16: DType
DTYPE_FLOAT16: DType
CACHE_STATUS_UNSPECIFIED: CacheStatus
CACHE_MISS: CacheStatus
CACHE_HIT: CacheStatus
CACHE_COALESCED: CacheStatus
CACHE_BYPASS: CacheStatus

class ConsumerInfo(_message.Message):
    __slots__ = ("session_id", "device_uuid")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    device_uuid: str
    def __init__(self, session_id: _Optional[str] = ..., device_uuid: _Optional[str] = ...) -> None: ...

class SessionHello(_message.Message):
    __slots__ = ("pid", "hostname", "boot_id", "pid_namespace", "device_uuid", "transport", "transport_info")
    PID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    PID_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_INFO_FIELD_NUMBER: _ClassVar[int]
    pid: int
    hostname: str
    boot_id: str
    pid_namespace: int
    device_uuid: str
    transport: str
    transport_info: bytes
    def __init__(self, pid: _Optional[int] = ..., hostname: _Optional[str] = ..., boot_id: _Optional[str] = ..., pid_namespace: _Optional[int] = ..., device_uuid: _Optional[str] = ..., transport: _Optional[str] = ..., transport_info: _Optional[bytes] = ...) -> None: ...

class LeaseRelease(_message.Message):
    __slots__ = ("lease_ids", "unread")
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    UNREAD_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[int]
    unread: bool
    def __init__(self, lease_ids: _Optional[_Iterable[int]] = ..., unread: _Optional[bool] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("hello", "release", "transport_message")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    hello: SessionHello
    release: LeaseRelease
    transport_message: bytes
    def __init__(self, hello: _Optional[_Union[SessionHello, _Mapping]] = ..., release: _Optional[_Union[LeaseRelease, _Mapping]] = ..., transport_message: _Optional[bytes] = ...) -> None: ...

class PoolInfo(_message.Message):
    __slots__ = ("pool_id", "epoch", "device_uuid", "ipc_handle", "pool_bytes", "num_word_slots")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    POOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_WORD_SLOTS_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    epoch: int
    device_uuid: str
    ipc_handle: bytes
    pool_bytes: int
    num_word_slots: int
    def __init__(self, pool_id: _Optional[str] = ..., epoch: _Optional[int] = ..., device_uuid: _Optional[str] = ..., ipc_handle: _Optional[bytes] = ..., pool_bytes: _Optional[int] = ..., num_word_slots: _Optional[int] = ...) -> None: ...

class SessionOpened(_message.Message):
    __slots__ = ("session_id", "pool", "transport_info")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_INFO_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    pool: PoolInfo
    transport_info: bytes
    def __init__(self, session_id: _Optional[str] = ..., pool: _Optional[_Union[PoolInfo, _Mapping]] = ..., transport_info: _Optional[bytes] = ...) -> None: ...

class SessionRefused(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("opened", "refused", "transport_message")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    opened: SessionOpened
    refused: SessionRefused
    transport_message: bytes
    def __init__(self, opened: _Optional[_Union[SessionOpened, _Mapping]] = ..., refused: _Optional[_Union[SessionRefused, _Mapping]] = ..., transport_message: _Optional[bytes] = ...) -> None: ...

class EncodeImagesRequest(_message.Message):
    __slots__ = ("images", "request_id", "transport", "consumer", "readers", "keys", "headers_only", "mm_hashes", "cache_bypass", "transport_name")
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    HEADERS_ONLY_FIELD_NUMBER: _ClassVar[int]
    MM_HASHES_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYPASS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedScalarFieldContainer[bytes]
    request_id: str
    transport: Transport
    consumer: ConsumerInfo
    readers: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    headers_only: bool
    mm_hashes: _containers.RepeatedScalarFieldContainer[str]
    cache_bypass: bool
    transport_name: str
    def __init__(self, images: _Optional[_Iterable[bytes]] = ..., request_id: _Optional[str] = ..., transport: _Optional[_Union[Transport, str]] = ..., consumer: _Optional[_Union[ConsumerInfo, _Mapping]] = ..., readers: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ..., headers_only: _Optional[bool] = ..., mm_hashes: _Optional[_Iterable[str]] = ..., cache_bypass: _Optional[bool] = ..., transport_name: _Optional[str] = ...) -> None: ...

class IpcDescriptor(_message.Message):
    __slots__ = ("pool_id", "epoch", "device_uuid", "offset_bytes", "nbytes", "lease_id", "generation", "ready_offset_bytes", "ack_offset_bytes", "readers", "reader_ack_offset_bytes")
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    READY_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACK_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    READER_ACK_OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    pool_id: str
    epoch: int
    device_uuid: str
    offset_bytes: int
    nbytes: int
    lease_id: int
    generation: int
    ready_offset_bytes: int
    ack_offset_bytes: int
    readers: int
    reader_ack_offset_bytes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, pool_id: _Optional[str] = ..., epoch: _Optional[int] = ..., device_uuid: _Optional[str] = ..., offset_bytes: _Optional[int] = ..., nbytes: _Optional[int] = ..., lease_id: _Optional[int] = ..., generation: _Optional[int] = ..., ready_offset_bytes: _Optional[int] = ..., ack_offset_bytes: _Optional[int] = ..., readers: _Optional[int] = ..., reader_ack_offset_bytes: _Optional[_Iterable[int]] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("index", "num_tokens", "grid_h", "grid_w", "dtype", "shape", "data", "ipc", "handle", "grid_t", "image_width", "image_height", "key", "cache", "mm_hash")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GRID_H_FIELD_NUMBER: _ClassVar[int]
    GRID_W_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    IPC_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    GRID_T_FIELD_NUMBER: _ClassVar[int]
    IMAGE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    IMAGE_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    MM_HASH_FIELD_NUMBER: _ClassVar[int]
    index: int
    num_tokens: int
    grid_h: int
    grid_w: int
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    ipc: IpcDescriptor
    handle: bytes
    grid_t: int
    image_width: int
    image_height: int
    key: str
    cache: CacheStatus
    mm_hash: str
    def __init__(self, index: _Optional[int] = ..., num_tokens: _Optional[int] = ..., grid_h: _Optional[int] = ..., grid_w: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., ipc: _Optional[_Union[IpcDescriptor, _Mapping]] = ..., handle: _Optional[bytes] = ..., grid_t: _Optional[int] = ..., image_width: _Optional[int] = ..., image_height: _Optional[int] = ..., key: _Optional[str] = ..., cache: _Optional[_Union[CacheStatus, str]] = ..., mm_hash: _Optional[str] = ...) -> None: ...

class EncodeImagesResponse(_message.Message):
    __slots__ = ("request_id", "embeddings", "transport", "transport_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    transport: Transport
    transport_name: str
    def __init__(self, request_id: _Optional[str] = ..., embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., transport: _Optional[_Union[Transport, str]] = ..., transport_name: _Optional[str] = ...) -> None: ...

class SharedEmbeddings(_message.Message):
    __slots__ = ("reply", "pool", "readers")
    REPLY_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    reply: EncodeImagesResponse
    pool: PoolInfo
    readers: int
    def __init__(self, reply: _Optional[_Union[EncodeImagesResponse, _Mapping]] = ..., pool: _Optional[_Union[PoolInfo, _Mapping]] = ..., readers: _Optional[int] = ...) -> None: ...

class EncodeImagesChunk(_message.Message):
    __slots__ = ("request_id", "header", "index", "offset", "data")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    header: Embedding
    index: int
    offset: int
    data: bytes
    def __init__(self, request_id: _Optional[str] = ..., header: _Optional[_Union[Embedding, _Mapping]] = ..., index: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Video(_message.Message):
    __slots__ = ("data", "fps", "num_frames")
    DATA_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    fps: float
    num_frames: int
    def __init__(self, data: _Optional[bytes] = ..., fps: _Optional[float] = ..., num_frames: _Optional[int] = ...) -> None: ...

class EncodeVideosRequest(_message.Message):
    __slots__ = ("videos", "request_id", "transport", "consumer", "readers")
    VIDEOS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    videos: _containers.RepeatedCompositeFieldContainer[Video]
    request_id: str
    transport: Transport
    consumer: ConsumerInfo
    readers: int
    def __init__(self, videos: _Optional[_Iterable[_Union[Video, _Mapping]]] = ..., request_id: _Optional[str] = ..., transport: _Optional[_Union[Transport, str]] = ..., consumer: _Optional[_Union[ConsumerInfo, _Mapping]] = ..., readers: _Optional[int] = ...) -> None: ...

class VideoChunk(_message.Message):
    __slots__ = ("embedding", "timestamp_s")
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_S_FIELD_NUMBER: _ClassVar[int]
    embedding: Embedding
    timestamp_s: float
    def __init__(self, embedding: _Optional[_Union[Embedding, _Mapping]] = ..., timestamp_s: _Optional[float] = ...) -> None: ...

class EncodedVideo(_message.Message):
    __slots__ = ("index", "chunks", "num_tokens", "frame_indices", "fps", "width", "height")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FRAME_INDICES_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    index: int
    chunks: _containers.RepeatedCompositeFieldContainer[VideoChunk]
    num_tokens: int
    frame_indices: _containers.RepeatedScalarFieldContainer[int]
    fps: float
    width: int
    height: int
    def __init__(self, index: _Optional[int] = ..., chunks: _Optional[_Iterable[_Union[VideoChunk, _Mapping]]] = ..., num_tokens: _Optional[int] = ..., frame_indices: _Optional[_Iterable[int]] = ..., fps: _Optional[float] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class EncodeVideosResponse(_message.Message):
    __slots__ = ("request_id", "videos", "transport")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    VIDEOS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    videos: _containers.RepeatedCompositeFieldContainer[EncodedVideo]
    transport: Transport
    def __init__(self, request_id: _Optional[str] = ..., videos: _Optional[_Iterable[_Union[EncodedVideo, _Mapping]]] = ..., transport: _Optional[_Union[Transport, str]] = ...) -> None: ...

class VideoInfo(_message.Message):
    __slots__ = ("supported", "fps", "temporal_patch_size", "max_patches_per_frame", "max_videos_per_request", "max_video_bytes", "max_duration_s", "max_fps", "max_pixels", "max_sampled_frames_per_video", "max_sampled_frames_per_request", "max_sample_fps", "containers", "codecs", "chunk_header", "placeholder", "chunk_footer")
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    TEMPORAL_PATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_PATCHES_PER_FRAME_FIELD_NUMBER: _ClassVar[int]
    MAX_VIDEOS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_VIDEO_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    MAX_FPS_FIELD_NUMBER: _ClassVar[int]
    MAX_PIXELS_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLED_FRAMES_PER_VIDEO_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLED_FRAMES_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_SAMPLE_FPS_FIELD_NUMBER: _ClassVar[int]
    CONTAINERS_FIELD_NUMBER: _ClassVar[int]
    CODECS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_HEADER_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FOOTER_FIELD_NUMBER: _ClassVar[int]
    supported: bool
    fps: float
    temporal_patch_size: int
    max_patches_per_frame: int
    max_videos_per_request: int
    max_video_bytes: int
    max_duration_s: float
    max_fps: float
    max_pixels: int
    max_sampled_frames_per_video: int
    max_sampled_frames_per_request: int
    max_sample_fps: float
    containers: _containers.RepeatedScalarFieldContainer[str]
    codecs: _containers.RepeatedScalarFieldContainer[str]
    chunk_header: str
    placeholder: str
    chunk_footer: str
    def __init__(self, supported: _Optional[bool] = ..., fps: _Optional[float] = ..., temporal_patch_size: _Optional[int] = ..., max_patches_per_frame: _Optional[int] = ..., max_videos_per_request: _Optional[int] = ..., max_video_bytes: _Optional[int] = ..., max_duration_s: _Optional[float] = ..., max_fps: _Optional[float] = ..., max_pixels: _Optional[int] = ..., max_sampled_frames_per_video: _Optional[int] = ..., max_sampled_frames_per_request: _Optional[int] = ..., max_sample_fps: _Optional[float] = ..., containers: _Optional[_Iterable[str]] = ..., codecs: _Optional[_Iterable[str]] = ..., chunk_header: _Optional[str] = ..., placeholder: _Optional[str] = ..., chunk_footer: _Optional[str] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PreprocessInfo(_message.Message):
    __slots__ = ("family", "patch_size", "merge_h", "merge_w", "max_patches_per_image", "rules")
    class RulesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MERGE_H_FIELD_NUMBER: _ClassVar[int]
    MERGE_W_FIELD_NUMBER: _ClassVar[int]
    MAX_PATCHES_PER_IMAGE_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    family: str
    patch_size: int
    merge_h: int
    merge_w: int
    max_patches_per_image: int
    rules: _containers.ScalarMap[str, str]
    def __init__(self, family: _Optional[str] = ..., patch_size: _Optional[int] = ..., merge_h: _Optional[int] = ..., merge_w: _Optional[int] = ..., max_patches_per_image: _Optional[int] = ..., rules: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RequestLimits(_message.Message):
    __slots__ = ("max_image_bytes", "max_pixels", "max_images_per_request", "max_request_bytes", "max_patches_per_request", "max_aspect_ratio", "formats")
    MAX_IMAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PIXELS_FIELD_NUMBER: _ClassVar[int]
    MAX_IMAGES_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PATCHES_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_ASPECT_RATIO_FIELD_NUMBER: _ClassVar[int]
    FORMATS_FIELD_NUMBER: _ClassVar[int]
    max_image_bytes: int
    max_pixels: int
    max_images_per_request: int
    max_request_bytes: int
    max_patches_per_request: int
    max_aspect_ratio: float
    formats: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, max_image_bytes: _Optional[int] = ..., max_pixels: _Optional[int] = ..., max_images_per_request: _Optional[int] = ..., max_request_bytes: _Optional[int] = ..., max_patches_per_request: _Optional[int] = ..., max_aspect_ratio: _Optional[float] = ..., formats: _Optional[_Iterable[str]] = ...) -> None: ...

class PromptFraming(_message.Message):
    __slots__ = ("image_header", "placeholder", "image_footer", "placeholder_token_id")
    IMAGE_HEADER_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FOOTER_FIELD_NUMBER: _ClassVar[int]
    PLACEHOLDER_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    image_header: str
    placeholder: str
    image_footer: str
    placeholder_token_id: int
    def __init__(self, image_header: _Optional[str] = ..., placeholder: _Optional[str] = ..., image_footer: _Optional[str] = ..., placeholder_token_id: _Optional[int] = ...) -> None: ...

class CacheInfo(_message.Message):
    __slots__ = ("host_max_bytes", "pool_max_bytes", "policy", "hash", "invalid_ttl_s")
    HOST_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    POOL_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    INVALID_TTL_S_FIELD_NUMBER: _ClassVar[int]
    host_max_bytes: int
    pool_max_bytes: int
    policy: str
    hash: str
    invalid_ttl_s: float
    def __init__(self, host_max_bytes: _Optional[int] = ..., pool_max_bytes: _Optional[int] = ..., policy: _Optional[str] = ..., hash: _Optional[str] = ..., invalid_ttl_s: _Optional[float] = ...) -> None: ...

class KeyStoreInfo(_message.Message):
    __slots__ = ("max_bytes", "ttl_s", "max_keys")
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_KEYS_FIELD_NUMBER: _ClassVar[int]
    max_bytes: int
    ttl_s: float
    max_keys: int
    def __init__(self, max_bytes: _Optional[int] = ..., ttl_s: _Optional[float] = ..., max_keys: _Optional[int] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "model_name", "model_layout", "hidden_size", "vision_hidden_size", "dtype", "device", "device_uuid", "preprocess", "limits", "transports", "ipc_status", "max_message_bytes", "stream_chunk_bytes", "family", "prompt", "key_store", "cache", "transport_names", "quantization", "node_boot_id", "video")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    VISION_HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    PREPROCESS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORTS_FIELD_NUMBER: _ClassVar[int]
    IPC_STATUS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STREAM_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    KEY_STORE_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_NAMES_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    NODE_BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    VIDEO_FIELD_NUMBER: _ClassVar[int]
    version: str
    model_name: str
    model_layout: str
    hidden_size: int
    vision_hidden_size: int
    dtype: DType
    device: str
    device_uuid: str
    preprocess: PreprocessInfo
    limits: RequestLimits
    transports: _containers.RepeatedScalarFieldContainer[Transport]
    ipc_status: str
    max_message_bytes: int
    stream_chunk_bytes: int
    family: str
    prompt: PromptFraming
    key_store: KeyStoreInfo
    cache: CacheInfo
    transport_names: _containers.RepeatedScalarFieldContainer[str]
    quantization: str
    node_boot_id: str
    video: VideoInfo
    def __init__(self, version: _Optional[str] = ..., model_name: _Optional[str] = ..., model_layout: _Optional[str] = ..., hidden_size: _Optional[int] = ..., vision_hidden_size: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., device: _Optional[str] = ..., device_uuid: _Optional[str] = ..., preprocess: _Optional[_Union[PreprocessInfo, _Mapping]] = ..., limits: _Optional[_Union[RequestLimits, _Mapping]] = ..., transports: _Optional[_Iterable[_Union[Transport, str]]] = ..., ipc_status: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., stream_chunk_bytes: _Optional[int] = ..., family: _Optional[str] = ..., prompt: _Optional[_Union[PromptFraming, _Mapping]] = ..., key_store: _Optional[_Union[KeyStoreInfo, _Mapping]] = ..., cache: _Optional[_Union[CacheInfo, _Mapping]] = ..., transport_names: _Optional[_Iterable[str]] = ..., quantization: _Optional[str] = ..., node_boot_id: _Optional[str] = ..., video: _Optional[_Union[VideoInfo, _Mapping]] = ...) -> None: ...

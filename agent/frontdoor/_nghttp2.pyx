# cython: language_level=3, boundscheck=False, wraparound=False
"""A thin server-side HTTP/2 session over libnghttp2, for the native gRPC door.

nghttp2 does the framing, HPACK, flow control and stream states in C; this
module hands Python one call per request event (headers, a data chunk, the
end of the request, the stream's close) and takes whole responses back. The
owner object passed in implements:

    on_headers(stream_id, [(name, value), ...])   request headers, latin-1 str
    on_data(stream_id, bytes)
    on_end(stream_id)                              the client finished sending
    on_close(stream_id, error_code)                the stream is gone
    on_control(kind)                               a "reset", "ping", "settings" or
                                                   "priority" frame came (flood accounting)
"""

from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeLatin1
from libc.stdint cimport int32_t, uint8_t, uint32_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy


cdef extern from "nghttp2/nghttp2.h":
    ctypedef struct nghttp2_session:
        pass
    ctypedef struct nghttp2_session_callbacks:
        pass
    ctypedef struct nghttp2_option:
        pass
    ctypedef struct nghttp2_frame_hd:
        size_t length
        int32_t stream_id
        uint8_t type
        uint8_t flags
    ctypedef struct nghttp2_headers:
        nghttp2_frame_hd hd
        int cat
    ctypedef union nghttp2_frame:
        nghttp2_frame_hd hd
        nghttp2_headers headers
    ctypedef struct nghttp2_nv:
        uint8_t *name
        uint8_t *value
        size_t namelen
        size_t valuelen
        uint8_t flags
    ctypedef union nghttp2_data_source:
        int fd
        void *ptr
    ctypedef Py_ssize_t (*nghttp2_data_source_read_callback)(
        nghttp2_session *, int32_t, uint8_t *, size_t, uint32_t *, nghttp2_data_source *, void *)
    ctypedef struct nghttp2_data_provider:
        nghttp2_data_source source
        nghttp2_data_source_read_callback read_callback
    ctypedef struct nghttp2_settings_entry:
        int32_t settings_id
        uint32_t value

    ctypedef int (*begin_headers_cb)(nghttp2_session *, const nghttp2_frame *, void *)
    ctypedef int (*header_cb)(nghttp2_session *, const nghttp2_frame *, const uint8_t *, size_t,
                              const uint8_t *, size_t, uint8_t, void *)
    ctypedef int (*data_chunk_cb)(nghttp2_session *, uint8_t, int32_t, const uint8_t *, size_t,
                                  void *)
    ctypedef int (*frame_recv_cb)(nghttp2_session *, const nghttp2_frame *, void *)
    ctypedef int (*stream_close_cb)(nghttp2_session *, int32_t, uint32_t, void *)

    int NGHTTP2_DATA
    int NGHTTP2_HEADERS
    int NGHTTP2_PRIORITY
    int NGHTTP2_RST_STREAM
    int NGHTTP2_SETTINGS
    int NGHTTP2_PING
    int NGHTTP2_FLAG_ACK
    int NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE
    int NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE
    int NGHTTP2_HCAT_REQUEST
    int NGHTTP2_FLAG_NONE
    int NGHTTP2_FLAG_END_STREAM
    int NGHTTP2_DATA_FLAG_EOF
    int NGHTTP2_DATA_FLAG_NO_END_STREAM
    int NGHTTP2_ERR_DEFERRED
    int NGHTTP2_ERR_CALLBACK_FAILURE
    int NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS
    int NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
    int NGHTTP2_SETTINGS_MAX_FRAME_SIZE
    int NGHTTP2_NO_ERROR
    int NGHTTP2_CANCEL

    int nghttp2_session_callbacks_new(nghttp2_session_callbacks **)
    void nghttp2_session_callbacks_del(nghttp2_session_callbacks *)
    void nghttp2_session_callbacks_set_on_begin_headers_callback(nghttp2_session_callbacks *,
                                                                 begin_headers_cb)
    void nghttp2_session_callbacks_set_on_header_callback(nghttp2_session_callbacks *, header_cb)
    void nghttp2_session_callbacks_set_on_data_chunk_recv_callback(nghttp2_session_callbacks *,
                                                                   data_chunk_cb)
    void nghttp2_session_callbacks_set_on_frame_recv_callback(nghttp2_session_callbacks *,
                                                              frame_recv_cb)
    void nghttp2_session_callbacks_set_on_stream_close_callback(nghttp2_session_callbacks *,
                                                                stream_close_cb)
    int nghttp2_session_server_new2(nghttp2_session **, const nghttp2_session_callbacks *, void *,
                                    const nghttp2_option *)
    int nghttp2_option_new(nghttp2_option **)
    void nghttp2_option_del(nghttp2_option *)
    void nghttp2_option_set_no_auto_window_update(nghttp2_option *, int)
    int nghttp2_session_consume_connection(nghttp2_session *, size_t)
    int nghttp2_session_consume_stream(nghttp2_session *, int32_t, size_t)
    int nghttp2_session_want_read(nghttp2_session *)
    int nghttp2_session_want_write(nghttp2_session *)
    void nghttp2_session_del(nghttp2_session *)
    Py_ssize_t nghttp2_session_mem_recv(nghttp2_session *, const uint8_t *, size_t)
    Py_ssize_t nghttp2_session_mem_send(nghttp2_session *, const uint8_t **)
    int nghttp2_submit_settings(nghttp2_session *, uint8_t, const nghttp2_settings_entry *, size_t)
    int nghttp2_session_set_local_window_size(nghttp2_session *, uint8_t, int32_t, int32_t)
    int nghttp2_submit_response(nghttp2_session *, int32_t, const nghttp2_nv *, size_t,
                                const nghttp2_data_provider *)
    int nghttp2_submit_trailer(nghttp2_session *, int32_t, const nghttp2_nv *, size_t)
    int nghttp2_submit_rst_stream(nghttp2_session *, uint8_t, int32_t, uint32_t)
    int nghttp2_session_resume_data(nghttp2_session *, int32_t)
    int nghttp2_submit_goaway(nghttp2_session *, uint8_t, int32_t, uint32_t, const uint8_t *,
                              size_t)
    int32_t nghttp2_session_get_last_proc_stream_id(nghttp2_session *)
    const char *nghttp2_strerror(int)


class HTTP2Error(Exception):
    """The peer broke HTTP/2: the connection is over."""


cdef class _Out:
    """What a stream still has to send: bytes, then trailers (or the stream's end)."""
    cdef bytearray data
    cdef Py_ssize_t pos
    cdef list trailers
    cdef bint finished
    cdef bint deferred

    def __cinit__(self):
        self.data = bytearray()
        self.pos = 0
        self.trailers = None
        self.finished = False
        self.deferred = False


cdef nghttp2_nv *_nva(list headers) except NULL:
    """A C array over the (bytes, bytes) pairs; nghttp2 copies them on submit."""
    cdef Py_ssize_t n = len(headers), i
    cdef nghttp2_nv *nva = <nghttp2_nv *> malloc(max(n, 1) * sizeof(nghttp2_nv))
    if nva == NULL:
        raise MemoryError()
    for i in range(n):
        name, value = headers[i]
        nva[i].name = <uint8_t *> PyBytes_AS_STRING(name)
        nva[i].namelen = len(name)
        nva[i].value = <uint8_t *> PyBytes_AS_STRING(value)
        nva[i].valuelen = len(value)
        nva[i].flags = 0
    return nva


cdef Py_ssize_t _read(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                      uint32_t *flags, nghttp2_data_source *source, void *user) noexcept with gil:
    cdef Session self = <Session> user
    cdef _Out out = self._out.get(stream_id)
    cdef Py_ssize_t avail, n
    cdef nghttp2_nv *nva
    if out is None:
        flags[0] |= NGHTTP2_DATA_FLAG_EOF
        return 0
    avail = len(out.data) - out.pos
    n = min(<Py_ssize_t> length, avail)
    if n > 0:
        memcpy(buf, PyByteArray_AS_STRING(out.data) + out.pos, n)
        out.pos += n
        if out.pos == len(out.data):
            del out.data[:]
            out.pos = 0
    if out.pos == 0 and not out.data:
        if out.finished:
            flags[0] |= NGHTTP2_DATA_FLAG_EOF
            del self._out[stream_id]
            if out.trailers is not None:
                flags[0] |= NGHTTP2_DATA_FLAG_NO_END_STREAM
                try:
                    nva = _nva(out.trailers)
                except Exception:
                    return NGHTTP2_ERR_CALLBACK_FAILURE
                nghttp2_submit_trailer(session, stream_id, nva, len(out.trailers))
                free(nva)
        elif n == 0:
            out.deferred = True
            return NGHTTP2_ERR_DEFERRED
    return n


cdef int _begin_headers(nghttp2_session *session, const nghttp2_frame *frame,
                        void *user) noexcept with gil:
    cdef Session self = <Session> user
    if frame.hd.type == NGHTTP2_HEADERS and frame.headers.cat == NGHTTP2_HCAT_REQUEST:
        self._headers[frame.hd.stream_id] = []
        self._header_bytes = 0
    return 0


cdef int _header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
                 size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                 void *user) noexcept with gil:
    cdef Session self = <Session> user
    cdef int32_t stream_id = frame.hd.stream_id
    headers = self._headers.get(stream_id)
    if headers is not None:
        # RFC 7541's size of an entry: name, value and 32 bytes of overhead.
        self._header_bytes += namelen + valuelen + 32
        if self._header_bytes > self._max_header_list:
            del self._headers[stream_id]
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE  # nghttp2 resets the stream
        try:
            headers.append((PyUnicode_DecodeLatin1(<char *> name, namelen, NULL),
                            PyUnicode_DecodeLatin1(<char *> value, valuelen, NULL)))
        except BaseException as exc:
            self._error = exc
            return NGHTTP2_ERR_CALLBACK_FAILURE
    return 0


cdef int _data_chunk(nghttp2_session *session, uint8_t flags, int32_t stream_id,
                     const uint8_t *data, size_t length, void *user) noexcept with gil:
    cdef Session self = <Session> user
    try:
        self._owner.on_data(stream_id, PyBytes_FromStringAndSize(<char *> data, length))
    except BaseException as exc:
        self._error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE
    return 0


cdef int _frame_recv(nghttp2_session *session, const nghttp2_frame *frame,
                     void *user) noexcept with gil:
    cdef Session self = <Session> user
    cdef int32_t stream_id = frame.hd.stream_id
    try:
        if frame.hd.type == NGHTTP2_HEADERS:
            headers = self._headers.pop(stream_id, None)
            if headers is not None:
                self._owner.on_headers(stream_id, headers)
            if frame.hd.flags & NGHTTP2_FLAG_END_STREAM:
                self._owner.on_end(stream_id)
        elif frame.hd.type == NGHTTP2_DATA and frame.hd.flags & NGHTTP2_FLAG_END_STREAM:
            self._owner.on_end(stream_id)
        elif frame.hd.type == NGHTTP2_RST_STREAM:
            self._owner.on_control("reset")
        elif frame.hd.type == NGHTTP2_PING and not frame.hd.flags & NGHTTP2_FLAG_ACK:
            self._owner.on_control("ping")
        elif frame.hd.type == NGHTTP2_SETTINGS and not frame.hd.flags & NGHTTP2_FLAG_ACK:
            self._owner.on_control("settings")
        elif frame.hd.type == NGHTTP2_PRIORITY:
            self._owner.on_control("priority")
    except BaseException as exc:
        self._error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE
    return 0


cdef int _stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                       void *user) noexcept with gil:
    cdef Session self = <Session> user
    self._out.pop(stream_id, None)
    self._headers.pop(stream_id, None)
    try:
        self._owner.on_close(stream_id, error_code)
    except BaseException as exc:
        self._error = exc
        return NGHTTP2_ERR_CALLBACK_FAILURE
    return 0


cdef class Session:
    """One server-side HTTP/2 connection. Feed it bytes with `receive`, take what
    to write with `pending`; respond with `respond` and `send`."""
    cdef nghttp2_session *_session
    cdef object _owner
    cdef dict _headers
    cdef dict _out
    cdef object _error
    cdef size_t _header_bytes
    cdef size_t _max_header_list

    def __cinit__(self, owner, uint32_t max_streams, uint32_t window, uint32_t max_frame,
                  uint32_t connection_window, uint32_t max_header_list):
        """Windows are refilled only by `consume` (the door calls it as calls take
        their data); streams beyond `max_streams` and header lists beyond
        `max_header_list` bytes are refused."""
        cdef nghttp2_session_callbacks *callbacks
        cdef nghttp2_option *option
        cdef nghttp2_settings_entry settings[4]
        self._owner = owner
        self._headers = {}
        self._out = {}
        self._error = None
        self._header_bytes = 0
        self._max_header_list = max_header_list
        if nghttp2_session_callbacks_new(&callbacks) != 0:
            raise MemoryError()
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, _begin_headers)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, _header)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, _data_chunk)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, _frame_recv)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, _stream_close)
        if nghttp2_option_new(&option) != 0:
            nghttp2_session_callbacks_del(callbacks)
            raise MemoryError()
        nghttp2_option_set_no_auto_window_update(option, 1)
        rv = nghttp2_session_server_new2(&self._session, callbacks, <void *> self, option)
        nghttp2_option_del(option)
        nghttp2_session_callbacks_del(callbacks)
        if rv != 0:
            raise MemoryError()
        settings[0].settings_id = NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS
        settings[0].value = max_streams
        settings[1].settings_id = NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE
        settings[1].value = window
        settings[2].settings_id = NGHTTP2_SETTINGS_MAX_FRAME_SIZE
        settings[2].value = max_frame
        settings[3].settings_id = NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE
        settings[3].value = max_header_list
        nghttp2_submit_settings(self._session, NGHTTP2_FLAG_NONE, settings, 4)
        nghttp2_session_set_local_window_size(self._session, NGHTTP2_FLAG_NONE, 0,
                                              connection_window)

    def __dealloc__(self):
        if self._session != NULL:
            nghttp2_session_del(self._session)

    def receive(self, bytes data):
        cdef Py_ssize_t rv = nghttp2_session_mem_recv(
            self._session, <const uint8_t *> PyBytes_AS_STRING(data), len(data))
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if rv < 0:
            raise HTTP2Error(nghttp2_strerror(<int> rv).decode())

    def pending(self):
        """Everything nghttp2 has to send now, as one bytes object."""
        cdef const uint8_t *data
        cdef Py_ssize_t n
        chunks = []
        while True:
            n = nghttp2_session_mem_send(self._session, &data)
            if n < 0:
                raise HTTP2Error(nghttp2_strerror(<int> n).decode())
            if n == 0:
                break
            chunks.append(PyBytes_FromStringAndSize(<char *> data, n))
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return b"".join(chunks)

    def respond(self, int32_t stream_id, list headers, bytes body=None, list trailers=None,
                bint finished=True):
        """Response headers, then `body` (if given), then `trailers` (if given) ending
        the stream. Without a body nor trailers the headers end it (trailers-only).
        finished=False keeps the stream open for `send`."""
        cdef nghttp2_data_provider provider
        cdef nghttp2_nv *nva = _nva(headers)
        cdef _Out out
        try:
            if body is None and trailers is None and finished:
                rv = nghttp2_submit_response(self._session, stream_id, nva, len(headers), NULL)
            else:
                out = _Out()
                if body:
                    out.data += body
                out.trailers = trailers
                out.finished = finished
                self._out[stream_id] = out
                provider.source.ptr = NULL
                provider.read_callback = _read
                rv = nghttp2_submit_response(self._session, stream_id, nva, len(headers),
                                             &provider)
        finally:
            free(nva)
        if rv != 0:
            self._out.pop(stream_id, None)
            raise HTTP2Error(nghttp2_strerror(rv).decode())

    def send(self, int32_t stream_id, bytes data, bint finished=False, list trailers=None):
        """More bytes on a stream opened with respond(finished=False); finished=True
        ends it (with `trailers` when given)."""
        cdef _Out out = self._out.get(stream_id)
        if out is None:
            return False  # the stream is gone
        out.data += data
        if finished:
            out.finished = True
            out.trailers = trailers
        if out.deferred:
            out.deferred = False
            nghttp2_session_resume_data(self._session, stream_id)
        return True

    def reset(self, int32_t stream_id, uint32_t error_code):
        self._out.pop(stream_id, None)
        nghttp2_submit_rst_stream(self._session, NGHTTP2_FLAG_NONE, stream_id, error_code)

    def consume(self, int32_t stream_id, size_t n):
        """`n` bytes of `stream_id` were taken by the application: refill the
        connection's window, and the stream's while it is open."""
        nghttp2_session_consume_connection(self._session, n)
        if stream_id:
            nghttp2_session_consume_stream(self._session, stream_id, n)  # gone: no matter

    def done(self):
        """nghttp2 has nothing to read or write any more (after a GOAWAY, its own or
        the peer's, once every stream is over): the connection may close."""
        return (nghttp2_session_want_read(self._session) == 0
                and nghttp2_session_want_write(self._session) == 0)

    def goaway(self, uint32_t error_code=0, bytes debug=b""):
        """GOAWAY with `error_code` (0: NO_ERROR, 11: ENHANCE_YOUR_CALM) and `debug`."""
        nghttp2_submit_goaway(self._session, NGHTTP2_FLAG_NONE,
                              nghttp2_session_get_last_proc_stream_id(self._session),
                              error_code, <const uint8_t *> PyBytes_AS_STRING(debug), len(debug))

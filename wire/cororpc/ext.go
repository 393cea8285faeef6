package cororpc

// Methods of this conductor beyond upstream's (issue 25). Upstream's bodies cannot grow:
// struct_pack hashes a type's whole structure into its type code, so a ServiceConfig with
// one more field is another type, which an upstream peer refuses. These are new methods
// with their own types, each embedding the upstream one; an upstream conductor answers
// them "function not registered", and an upstream client never calls them, so both keep
// working unchanged.
//
//	RegisterEx(RegisterExArgs{ServiceConfig, ProfileExt, optional<vector<string>> index_media})
//	    -> expected<RegisterResult, ErrorCode>
//	UnregisterAdapter(tuple<string instance_id, string tenant_id, int dp_rank, string lora_name>)
//	    -> expected<UnregisterResult, ErrorCode>
//	ListServiceDetails() -> vector<ServiceDetail{ServiceConfig, ProfileExt, vector<string>
//	    index_media, string hash_check}>
//
// with ProfileExt{string extra_keys, string lora_path, int64 lookahead_tokens}.

// Function ids of the methods above (FunctionID of ServiceQualifiedPrefix + name).
const (
	FuncRegisterEx         uint32 = 0x7a86e5c5
	FuncUnregisterAdapter  uint32 = 0xff4ffbb5
	FuncListServiceDetails uint32 = 0xd001f69e
)

// Type codes of their bodies (bit 0 clear; the tests derive them from the structure).
const (
	codeRegisterExArgs        uint32 = 0x5d787d80 // RegisterExArgs
	codeUnregisterAdapterArgs uint32 = 0x6192b998 // tuple<string, string, int, string>
	codeServiceDetails        uint32 = 0x6a84e2da // vector<ServiceDetail>
)

// ProfileExt are the hash_profile fields of issue 25: extra_keys ("" or "untagged" for
// the default, "tagged"), lora_path ("" none), lookahead_tokens (0 none).
type ProfileExt struct {
	ExtraKeys       string
	LoraPath        string
	LookaheadTokens int64
}

// RegisterExArgs is the RegisterEx argument: a registration with the fields upstream's
// ServiceConfig has no room for.
type RegisterExArgs struct {
	Config ServiceConfig
	Ext    ProfileExt
	// IndexMedia is index_media when HasIndexMedia (absent: the kind's default).
	IndexMedia    []string
	HasIndexMedia bool
}

// ServiceDetail is one ListServiceDetails entry: the ListServices entry and what it
// cannot carry.
type ServiceDetail struct {
	Config     ServiceConfig
	Ext        ProfileExt
	IndexMedia []string
	// HashCheck is the profile self-check of the entry's context: "ok", "unverified",
	// "mismatch (<suggestion>)" or "off".
	HashCheck string
}

func profileExtMax(m uint64, e *ProfileExt) uint64 {
	return maxLen(maxLen(m, len(e.ExtraKeys)), len(e.LoraPath))
}

func stringsMax(m uint64, list []string) uint64 {
	m = maxLen(m, len(list))
	for _, s := range list {
		m = maxLen(m, len(s))
	}
	return m
}

func appendProfileExt(dst []byte, w int, e *ProfileExt) []byte {
	dst = appendString(dst, w, e.ExtraKeys)
	dst = appendString(dst, w, e.LoraPath)
	return appendI64(dst, e.LookaheadTokens)
}

func appendStrings(dst []byte, w int, list []string) []byte {
	dst = appendLen(dst, w, len(list))
	for _, s := range list {
		dst = appendString(dst, w, s)
	}
	return dst
}

func (r *reader) profileExt(e *ProfileExt) {
	r.field = "ext.extra_keys"
	e.ExtraKeys = r.strCopy()
	r.field = "ext.lora_path"
	e.LoraPath = r.strCopy()
	r.field = "ext.lookahead_tokens"
	e.LookaheadTokens = r.i64()
}

// strs reads a vector<string> of copies.
func (r *reader) strs(field string) []string {
	r.field = field
	n := r.length(r.w)
	out := make([]string, 0, n)
	for range n {
		out = append(out, r.strCopy())
	}
	return out
}

// AppendRegisterExArgs appends the RegisterEx argument body.
func AppendRegisterExArgs(dst []byte, a *RegisterExArgs) []byte {
	m := profileExtMax(serviceConfigMax(0, &a.Config), &a.Ext)
	if a.HasIndexMedia {
		m = stringsMax(m, a.IndexMedia)
	}
	dst, w := begin(dst, codeRegisterExArgs, m)
	dst = appendServiceConfig(dst, w, &a.Config)
	dst = appendProfileExt(dst, w, &a.Ext)
	if !a.HasIndexMedia {
		return append(dst, 0)
	}
	return appendStrings(append(dst, 1), w, a.IndexMedia)
}

// DecodeRegisterExArgs decodes a RegisterEx argument body into a (strings copied).
func DecodeRegisterExArgs(body []byte, a *RegisterExArgs) error {
	r := open(body, codeRegisterExArgs)
	r.serviceConfig(&a.Config)
	r.profileExt(&a.Ext)
	r.field = "index_media"
	a.HasIndexMedia = r.flag()
	a.IndexMedia = nil
	if a.HasIndexMedia {
		a.IndexMedia = r.strs("index_media")
	}
	if err := r.finish(); err != nil {
		return decodeErr("RegisterExArgs", err)
	}
	return nil
}

// AppendUnregisterAdapterArgs appends the UnregisterAdapter argument body.
func AppendUnregisterAdapterArgs(dst []byte, instanceID, tenantID string, dpRank int32, loraName string) []byte {
	m := maxLen(maxLen(maxLen(0, len(instanceID)), len(tenantID)), len(loraName))
	dst, w := begin(dst, codeUnregisterAdapterArgs, m)
	dst = appendString(dst, w, instanceID)
	dst = appendString(dst, w, tenantID)
	dst = appendI32(dst, dpRank)
	return appendString(dst, w, loraName)
}

// DecodeUnregisterAdapterArgs decodes an UnregisterAdapter argument body.
func DecodeUnregisterAdapterArgs(body []byte) (instanceID, tenantID string, dpRank int32, loraName string, err error) {
	r := open(body, codeUnregisterAdapterArgs)
	instanceID, tenantID, dpRank = r.serviceID()
	r.field = "lora_name"
	loraName = r.strCopy()
	if err := r.finish(); err != nil {
		return "", "", 0, "", decodeErr("UnregisterAdapter arguments", err)
	}
	return instanceID, tenantID, dpRank, loraName, nil
}

// AppendServiceDetails appends the ListServiceDetails response body.
func AppendServiceDetails(dst []byte, list []ServiceDetail) []byte {
	m := maxLen(0, len(list))
	for i := range list {
		d := &list[i]
		m = stringsMax(profileExtMax(serviceConfigMax(m, &d.Config), &d.Ext), d.IndexMedia)
		m = maxLen(m, len(d.HashCheck))
	}
	dst, w := begin(dst, codeServiceDetails, m)
	dst = appendLen(dst, w, len(list))
	for i := range list {
		d := &list[i]
		dst = appendServiceConfig(dst, w, &d.Config)
		dst = appendProfileExt(dst, w, &d.Ext)
		dst = appendStrings(dst, w, d.IndexMedia)
		dst = appendString(dst, w, d.HashCheck)
	}
	return dst
}

// DecodeServiceDetails decodes a ListServiceDetails response body.
func DecodeServiceDetails(body []byte) ([]ServiceDetail, error) {
	r := open(body, codeServiceDetails)
	r.field = "services"
	// Each entry holds a ServiceConfig, three more lengths, the lookahead and the check.
	n := r.length(minServiceConfig(r.w) + 8 + 4*r.w)
	var list []ServiceDetail
	if n > 0 {
		list = make([]ServiceDetail, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		d := &list[i]
		r.serviceConfig(&d.Config)
		r.profileExt(&d.Ext)
		d.IndexMedia = r.strs("index_media")
		r.field = "hash_check"
		d.HashCheck = r.strCopy()
	}
	if err := r.finish(); err != nil {
		return nil, decodeErr("ServiceDetail list", err)
	}
	return list, nil
}

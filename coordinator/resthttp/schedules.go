package resthttp

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/berthci/berth/coordinator/internal/httpapi"
	"github.com/berthci/berth/coordinator/pipelines"
	"github.com/berthci/berth/coordinator/restapi"
	"github.com/berthci/berth/coordinator/store"
)

// Pipeline schedules: GitLab's pipeline schedules API. Who may do what is
// GitLab's rule, with Berth's protected refs (the default branch, the
// maintainers'):
//
//	read                           reporter
//	create, play                   developer (maintainer on a protected ref)
//	update, add and edit variables the schedule's owner (developer or more,
//	                               maintainer on a protected ref) or an
//	                               instance admin
//	delete, take ownership, see    maintainer, or the schedule's owner
//	variables, delete variables

func (s *API) scheduleRoutes(mux *http.ServeMux) {
	base := "/api/v4/projects/{project}/pipeline_schedules"
	mux.HandleFunc("GET "+base, s.projectMember(store.AccessReporter, s.handleListSchedules))
	mux.HandleFunc("POST "+base, s.projectMember(store.AccessDeveloper, s.handleCreateSchedule))
	mux.HandleFunc("GET "+base+"/{schedule}", s.projectMember(store.AccessReporter, s.handleGetSchedule))
	mux.HandleFunc("PUT "+base+"/{schedule}", s.projectMember(store.AccessDeveloper, s.handleUpdateSchedule))
	mux.HandleFunc("DELETE "+base+"/{schedule}", s.projectMember(store.AccessDeveloper, s.handleDeleteSchedule))
	mux.HandleFunc("GET "+base+"/{schedule}/pipelines", s.projectMember(store.AccessReporter, s.handleSchedulePipelines))
	mux.HandleFunc("POST "+base+"/{schedule}/play", s.projectMember(store.AccessDeveloper, s.handlePlaySchedule))
	mux.HandleFunc("POST "+base+"/{schedule}/take_ownership", s.projectMember(store.AccessDeveloper, s.handleTakeOwnership))
	mux.HandleFunc("POST "+base+"/{schedule}/variables", s.projectMember(store.AccessDeveloper, s.handleCreateScheduleVariable))
	mux.HandleFunc("GET "+base+"/{schedule}/variables/{key}", s.projectMember(store.AccessDeveloper, s.handleGetScheduleVariable))
	mux.HandleFunc("PUT "+base+"/{schedule}/variables/{key}", s.projectMember(store.AccessDeveloper, s.handleUpdateScheduleVariable))
	mux.HandleFunc("DELETE "+base+"/{schedule}/variables/{key}", s.projectMember(store.AccessDeveloper, s.handleDeleteScheduleVariable))
}

// scheduleRights is what the request's principal may do with a schedule.
type scheduleRights struct {
	who     *httpapi.Principal
	level   store.MemberAccess
	owner   bool // the principal owns the schedule
	refNeed store.MemberAccess
}

// ownerID is the owner a schedule created or taken by the principal gets.
func (sr scheduleRights) ownerID() int64 {
	if sr.who.User == nil {
		return 0
	}
	return sr.who.User.ID
}

// mayAdmin: delete, take ownership, see and delete variables.
func (sr scheduleRights) mayAdmin() bool {
	return sr.who.Admin() || sr.level >= store.AccessMaintainer || sr.owner && sr.level >= store.AccessDeveloper
}

// mayUpdate: change the schedule and its variables.
func (sr scheduleRights) mayUpdate() bool {
	return sr.who.Admin() || sr.owner && sr.level >= store.AccessDeveloper && sr.level >= sr.refNeed
}

func (s *API) rights(w http.ResponseWriter, r *http.Request, p *store.Project, ps *store.PipelineSchedule, ref string) (scheduleRights, bool) {
	who := principalOf(r)
	level, err := who.Access(r.Context(), s.store, p.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "checking a user's membership", err)
		return scheduleRights{}, false
	}
	sr := scheduleRights{who: who, level: level, refNeed: p.RunAccess(ref)}
	if ps != nil {
		sr.owner = ps.OwnerID == sr.ownerID()
	}
	return sr, true
}

// mayRun: play, and create (on the ref given).
func (sr scheduleRights) mayRun() bool { return sr.level >= sr.refNeed }

// allowed loads the {schedule} of the {project} and what the principal may
// do with it, answering 404, or 403 saying what it may not do, itself
// unless may allows it.
func (s *API) allowed(w http.ResponseWriter, r *http.Request, may func(scheduleRights) bool, what string) (*store.Project, *store.PipelineSchedule, scheduleRights, bool) {
	p, ps := s.schedule(w, r)
	if ps == nil {
		return nil, nil, scheduleRights{}, false
	}
	sr, ok := s.rights(w, r, p, ps, ps.Ref)
	if !ok {
		return nil, nil, scheduleRights{}, false
	}
	if !may(sr) {
		forbidden(w, sr.who, what)
		return nil, nil, scheduleRights{}, false
	}
	return p, ps, sr, true
}

func forbidden(w http.ResponseWriter, who *httpapi.Principal, what string) {
	httpapi.WriteError(w, http.StatusForbidden, fmt.Sprintf("403 Forbidden - %s may not %s", who, what))
}

// schedule loads the {schedule} of the {project}, answering 404 itself.
func (s *API) schedule(w http.ResponseWriter, r *http.Request) (*store.Project, *store.PipelineSchedule) {
	p := s.project(w, r)
	if p == nil {
		return nil, nil
	}
	id, ok := httpapi.PathID(w, r, "schedule")
	if !ok {
		return nil, nil
	}
	ps, err := s.pipelines.Schedule(r.Context(), p.ID, id)
	if errors.Is(err, pipelines.ErrNotFound) {
		httpapi.WriteError(w, http.StatusNotFound, "404 Pipeline Schedule Not Found")
		return nil, nil
	}
	if err != nil {
		httpapi.InternalError(s.log, w, "loading pipeline schedule", err)
		return nil, nil
	}
	return p, ps
}

func (s *API) handleListSchedules(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	scope := r.URL.Query().Get("scope")
	if scope != "" && scope != "active" && scope != "inactive" {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - scope does not have a valid value (active or inactive)")
		return
	}
	all, err := s.store.ListPipelineSchedules(r.Context(), p.ID)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing pipeline schedules", err)
		return
	}
	var ps []*store.PipelineSchedule
	for _, sc := range all {
		if scope == "" || sc.Active == (scope == "active") {
			ps = append(ps, sc)
		}
	}
	pg, ok := httpapi.Paginate(w, r, len(ps))
	if !ok {
		return
	}
	owners := map[int64]restapi.UserBasicJSON{}
	out := []restapi.PipelineScheduleJSON{}
	for _, sc := range ps[pg.From:pg.To] {
		j, err := s.scheduleJSON(r, sc, owners)
		if err != nil {
			httpapi.InternalError(s.log, w, "listing pipeline schedules", err)
			return
		}
		out = append(out, j)
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// scheduleJSON shows a schedule as in a list; owners caches the users
// read.
func (s *API) scheduleJSON(r *http.Request, ps *store.PipelineSchedule, owners map[int64]restapi.UserBasicJSON) (restapi.PipelineScheduleJSON, error) {
	owner, err := s.userBasic(r, ps.OwnerID, owners)
	if err != nil {
		return restapi.PipelineScheduleJSON{}, err
	}
	out := restapi.PipelineScheduleJSON{ID: ps.ID, Description: ps.Description, Ref: ps.Ref, Cron: ps.Cron, CronTimezone: ps.CronTimezone,
		NextRunAt: httpapi.RFC3339OrNil(ps.NextRunAt), Active: ps.Active, CreatedAt: httpapi.RFC3339OrNil(ps.CreatedAt),
		UpdatedAt: httpapi.RFC3339OrNil(ps.UpdatedAt), Owner: owner}
	for _, in := range ps.Inputs {
		out.Inputs = append(out.Inputs, restapi.ScheduleInputJSON{Name: in.Name, Value: in.Value})
	}
	return out, nil
}

// userBasic shows user id as GitLab's UserBasic (the admin token for 0, a
// ghost for a user who is gone); cache, when not nil, keeps the users
// read.
func (s *API) userBasic(r *http.Request, id int64, cache map[int64]restapi.UserBasicJSON) (restapi.UserBasicJSON, error) {
	if u, ok := cache[id]; ok {
		return u, nil
	}
	out := restapi.UserBasicJSON{Username: "admin", Name: "Administrator", State: "active"}
	if id != 0 {
		u, err := s.store.GetUser(r.Context(), id)
		switch {
		case errors.Is(err, store.ErrNotFound):
			out = restapi.UserBasicJSON{ID: id, Username: "ghost", Name: "Ghost User", State: "deleted"}
		case err != nil:
			return out, err
		default:
			out = restapi.UserBasicJSON{ID: u.ID, Username: u.Name, Name: u.Name, State: "active"}
		}
	}
	if cache != nil {
		cache[id] = out
	}
	return out, nil
}

// writeScheduleDetails answers one schedule with its last pipeline and,
// to those who may read them, its variables.
func (s *API) writeScheduleDetails(w http.ResponseWriter, r *http.Request, code int, p *store.Project, ps *store.PipelineSchedule) {
	out, err := s.scheduleJSON(r, ps, nil)
	if err != nil {
		httpapi.InternalError(s.log, w, "showing pipeline schedule", err)
		return
	}
	if ps.LastPipelineID != 0 {
		pl, err := s.store.GetPipeline(r.Context(), ps.LastPipelineID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			httpapi.InternalError(s.log, w, "showing pipeline schedule", err)
			return
		}
		if pl != nil {
			out.LastPipeline = new(s.basicPipelineJSON(pl))
		}
	}
	sr, ok := s.rights(w, r, p, ps, ps.Ref)
	if !ok {
		return
	}
	if sr.mayAdmin() {
		vars := []restapi.ScheduleVariableJSON{}
		for _, v := range ps.Variables {
			vars = append(vars, scheduleVariableJSON(v))
		}
		out.Variables = &vars
	}
	httpapi.WriteJSON(w, code, out)
}

func scheduleVariableJSON(v store.PipelineVariable) restapi.ScheduleVariableJSON {
	vt := "env_var"
	if v.File {
		vt = "file"
	}
	return restapi.ScheduleVariableJSON{Key: v.Key, Value: v.Value, VariableType: vt}
}

func (s *API) handleGetSchedule(w http.ResponseWriter, r *http.Request) {
	if p, ps := s.schedule(w, r); ps != nil {
		s.writeScheduleDetails(w, r, http.StatusOK, p, ps)
	}
}

// scheduleRequest is the body of a schedule create or update, JSON or a
// form: pointers tell "not given" from empty.
type scheduleRequest struct {
	Description  *string     `json:"description"`
	Ref          *string     `json:"ref"`
	Cron         *string     `json:"cron"`
	CronTimezone *string     `json:"cron_timezone"`
	Active       *bool       `json:"active"`
	Inputs       []inputEdit `json:"inputs"`
}

// inputEdit is one entry of inputs: a value to set, or with destroy (on
// update) a name to remove.
type inputEdit struct {
	Name    string    `json:"name"`
	Value   any       `json:"value"`
	Destroy *formBool `json:"destroy"`
}

// formBool is a boolean inside a JSON parameter (decodeParams coerces
// top-level ones), read as Grape coerces one: JSON true and false, 1 and
// 0, and parseGrapeBool's strings.
type formBool bool

func (b *formBool) UnmarshalJSON(data []byte) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	switch v := v.(type) {
	case bool:
		*b = formBool(v)
		return nil
	case string:
		x, err := parseGrapeBool(v)
		*b = formBool(x)
		return err
	case float64:
		if v == 0 || v == 1 {
			*b = v == 1
			return nil
		}
	}
	return fmt.Errorf("%s is not a boolean", data)
}

// decodeSchedule reads a schedule's parameters (decodeParams): inputs
// as JSON, or a form's inputs[][name], inputs[][value] and
// inputs[][destroy].
func decodeSchedule(w http.ResponseWriter, r *http.Request) (*scheduleRequest, bool) {
	var req scheduleRequest
	return &req, decodeParams(w, r, &req)
}

// apply sets the given fields on ps; inputs are merged by name, each
// named once.
func (req *scheduleRequest) apply(ps *store.PipelineSchedule) error {
	for i, in := range req.Inputs {
		for _, prev := range req.Inputs[:i] {
			if prev.Name == in.Name {
				return &pipelines.ValidationError{Fields: map[string][]string{"inputs": {fmt.Sprintf("input %q is given twice", in.Name)}}}
			}
		}
	}
	for _, f := range []struct {
		dst *string
		v   *string
	}{{&ps.Description, req.Description}, {&ps.Ref, req.Ref}, {&ps.Cron, req.Cron}, {&ps.CronTimezone, req.CronTimezone}} {
		if f.v != nil {
			*f.dst = *f.v
		}
	}
	ps.Cron = strings.TrimSpace(ps.Cron) // GitLab strips it
	if req.Active != nil {
		ps.Active = *req.Active
	}
	for _, in := range req.Inputs {
		i := 0
		for i < len(ps.Inputs) && ps.Inputs[i].Name != in.Name {
			i++
		}
		switch {
		case in.Destroy != nil && bool(*in.Destroy):
			if i < len(ps.Inputs) {
				ps.Inputs = append(ps.Inputs[:i], ps.Inputs[i+1:]...)
			}
		case i < len(ps.Inputs):
			ps.Inputs[i].Value = in.Value
		default:
			ps.Inputs = append(ps.Inputs, store.ScheduleInput{Name: in.Name, Value: in.Value})
		}
	}
	return nil
}

func (s *API) handleCreateSchedule(w http.ResponseWriter, r *http.Request) {
	p := s.project(w, r)
	if p == nil {
		return
	}
	req, ok := decodeSchedule(w, r)
	if !ok {
		return
	}
	ve := &pipelines.ValidationError{Fields: map[string][]string{}}
	for _, f := range []struct {
		name string
		v    *string
	}{{"description", req.Description}, {"ref", req.Ref}, {"cron", req.Cron}} {
		if f.v == nil {
			ve.Fields[f.name] = []string{"is missing"}
		}
	}
	if len(ve.Fields) > 0 {
		s.apiError(w, "creating pipeline schedule", ve)
		return
	}
	ps := &store.PipelineSchedule{ProjectID: p.ID, CronTimezone: "UTC", Active: true}
	if err := req.apply(ps); err != nil {
		s.apiError(w, "creating pipeline schedule", err)
		return
	}
	sr, ok := s.rights(w, r, p, nil, ps.Ref)
	if !ok {
		return
	}
	if !sr.mayRun() {
		forbidden(w, sr.who, "create a pipeline schedule for the protected ref "+ps.Ref)
		return
	}
	ps.OwnerID = sr.ownerID()
	if err := s.pipelines.CreateSchedule(r.Context(), ps); err != nil {
		s.apiError(w, "creating pipeline schedule", err)
		return
	}
	s.writeScheduleDetails(w, r, http.StatusCreated, p, ps)
}

func (s *API) handleUpdateSchedule(w http.ResponseWriter, r *http.Request) {
	p, ps, sr, ok := s.allowed(w, r, scheduleRights.mayUpdate, "update this pipeline schedule (only its owner may; a maintainer may take ownership first)")
	if !ok {
		return
	}
	req, ok := decodeSchedule(w, r)
	if !ok {
		return
	}
	s.changeSchedule(w, r, p, ps, sr, req.apply)
}

// changeSchedule applies change to the schedule, which sr may update, if
// sr may also run pipelines on its ref after the change (a ref may become
// protected), and answers the schedule.
func (s *API) changeSchedule(w http.ResponseWriter, r *http.Request, p *store.Project, ps *store.PipelineSchedule, sr scheduleRights, change func(*store.PipelineSchedule) error) {
	errRef := errors.New("ref")
	updated, err := s.pipelines.UpdateSchedule(r.Context(), p.ID, ps.ID, func(ps *store.PipelineSchedule) error {
		if err := change(ps); err != nil {
			return err
		}
		if sr.who.Admin() || sr.level >= p.RunAccess(ps.Ref) {
			return nil
		}
		return errRef
	})
	if errors.Is(err, errRef) {
		forbidden(w, sr.who, "point a pipeline schedule at a protected ref")
		return
	}
	if err != nil {
		s.apiError(w, "updating pipeline schedule", err)
		return
	}
	s.writeScheduleDetails(w, r, http.StatusOK, p, updated)
}

func (s *API) handleTakeOwnership(w http.ResponseWriter, r *http.Request) {
	p, ps, sr, ok := s.allowed(w, r, scheduleRights.mayAdmin, "take ownership of this pipeline schedule (maintainers may)")
	if !ok {
		return
	}
	if sr.owner {
		s.writeScheduleDetails(w, r, http.StatusOK, p, ps)
		return
	}
	owner := sr.ownerID()
	updated, err := s.pipelines.UpdateSchedule(r.Context(), p.ID, ps.ID, func(ps *store.PipelineSchedule) error { ps.OwnerID = owner; return nil })
	if err != nil {
		s.apiError(w, "taking ownership of a pipeline schedule", err)
		return
	}
	s.writeScheduleDetails(w, r, http.StatusCreated, p, updated)
}

func (s *API) handleDeleteSchedule(w http.ResponseWriter, r *http.Request) {
	_, ps, _, ok := s.allowed(w, r, scheduleRights.mayAdmin, "delete this pipeline schedule (its owner and maintainers may)")
	if !ok {
		return
	}
	if err := s.store.DeletePipelineSchedule(r.Context(), ps.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		httpapi.InternalError(s.log, w, "deleting pipeline schedule", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *API) handleSchedulePipelines(w http.ResponseWriter, r *http.Request) {
	_, ps := s.schedule(w, r)
	if ps == nil {
		return
	}
	q := r.URL.Query()
	f := store.PipelineFilter{ScheduleID: ps.ID, Newest: q.Get("sort") == "desc"}
	if st := q.Get("status"); st != "" {
		if !store.Status(st).Valid() {
			httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - status does not have a valid value")
			return
		}
		f.Statuses = []store.Status{store.Status(st)}
	}
	if so := q.Get("sort"); so != "" && so != "asc" && so != "desc" {
		httpapi.WriteError(w, http.StatusBadRequest, "400 Bad request - sort does not have a valid value (asc or desc)")
		return
	}
	pls, err := s.store.ListPipelines(r.Context(), f)
	if err != nil {
		httpapi.InternalError(s.log, w, "listing a schedule's pipelines", err)
		return
	}
	pg, ok := httpapi.Paginate(w, r, len(pls))
	if !ok {
		return
	}
	out := []restapi.PipelineBasicJSON{}
	for _, pl := range pls[pg.From:pg.To] {
		out = append(out, s.basicPipelineJSON(pl))
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// handlePlaySchedule runs the schedule now. GitLab queues the run and
// answers 201 at once; Berth creates the pipeline before answering, so
// what stops it (a ref that is gone, workflow rules) is answered as 400.
func (s *API) handlePlaySchedule(w http.ResponseWriter, r *http.Request) {
	_, ps, _, ok := s.allowed(w, r, scheduleRights.mayRun, "run pipelines on this schedule's protected ref")
	if !ok {
		return
	}
	if _, err := s.pipelines.PlaySchedule(r.Context(), ps); err != nil {
		s.apiError(w, "playing pipeline schedule", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, map[string]string{"message": "201 Created"})
}

// decodeScheduleVariable reads key, value and variable_type, JSON or form.
func decodeScheduleVariable(w http.ResponseWriter, r *http.Request) (*variableRequest, bool) {
	req, ok := decodeVariable(w, r)
	if ok && req.VariableType != nil && *req.VariableType != "env_var" && *req.VariableType != "file" {
		s := "variable_type does not have a valid value (env_var or file)"
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": s})
		return nil, false
	}
	return req, ok
}

func (s *API) handleCreateScheduleVariable(w http.ResponseWriter, r *http.Request) {
	p, ps, _, ok := s.allowed(w, r, scheduleRights.mayUpdate, "change the variables of this pipeline schedule (only its owner may)")
	if !ok {
		return
	}
	req, ok := decodeScheduleVariable(w, r)
	if !ok {
		return
	}
	if req.Key == nil || req.Value == nil {
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": "key is missing, value is missing"})
		return
	}
	v := store.PipelineVariable{Key: *req.Key, Value: *req.Value, File: req.VariableType != nil && *req.VariableType == "file"}
	errTaken := errors.New("taken")
	s.changeVariable(w, r, p, ps, http.StatusCreated, func(ps *store.PipelineSchedule) (*store.PipelineVariable, error) {
		for _, w := range ps.Variables {
			if w.Key == v.Key {
				return nil, errTaken
			}
		}
		ps.Variables = append(ps.Variables, v)
		return &ps.Variables[len(ps.Variables)-1], nil
	}, errTaken)
}

func (s *API) handleUpdateScheduleVariable(w http.ResponseWriter, r *http.Request) {
	p, ps, _, ok := s.allowed(w, r, scheduleRights.mayUpdate, "change the variables of this pipeline schedule (only its owner may)")
	if !ok {
		return
	}
	req, ok := decodeScheduleVariable(w, r)
	if !ok {
		return
	}
	key := r.PathValue("key")
	s.changeVariable(w, r, p, ps, http.StatusOK, func(ps *store.PipelineSchedule) (*store.PipelineVariable, error) {
		for i := range ps.Variables {
			if v := &ps.Variables[i]; v.Key == key {
				if req.Value != nil {
					v.Value = *req.Value
				}
				if req.VariableType != nil {
					v.File = *req.VariableType == "file"
				}
				return v, nil
			}
		}
		return nil, errVariableNotFound
	}, nil)
}

var errVariableNotFound = errors.New("no such variable")

// changeVariable edits the variables of a schedule the principal may
// update with edit, which returns the variable to answer.
func (s *API) changeVariable(w http.ResponseWriter, r *http.Request, p *store.Project, ps *store.PipelineSchedule, code int,
	edit func(*store.PipelineSchedule) (*store.PipelineVariable, error), errTaken error) {
	var out store.PipelineVariable
	_, err := s.pipelines.UpdateSchedule(r.Context(), p.ID, ps.ID, func(ps *store.PipelineSchedule) error {
		v, err := edit(ps)
		if v != nil {
			out = *v
		}
		return err
	})
	switch {
	case errTaken != nil && errors.Is(err, errTaken):
		httpapi.WriteJSON(w, http.StatusBadRequest, map[string]any{"message": map[string][]string{"key": {"has already been taken"}}})
	case errors.Is(err, errVariableNotFound):
		httpapi.WriteError(w, http.StatusNotFound, "404 Pipeline Schedule Variable Not Found")
	case err != nil:
		s.apiError(w, "changing a pipeline schedule's variables", err)
	default:
		httpapi.WriteJSON(w, code, scheduleVariableJSON(out))
	}
}

func (s *API) handleGetScheduleVariable(w http.ResponseWriter, r *http.Request) {
	_, ps, _, ok := s.allowed(w, r, scheduleRights.mayAdmin, "read the variables of this pipeline schedule (its owner and maintainers may)")
	if !ok {
		return
	}
	for _, v := range ps.Variables {
		if v.Key == r.PathValue("key") {
			httpapi.WriteJSON(w, http.StatusOK, scheduleVariableJSON(v))
			return
		}
	}
	httpapi.WriteError(w, http.StatusNotFound, "404 Pipeline Schedule Variable Not Found")
}

func (s *API) handleDeleteScheduleVariable(w http.ResponseWriter, r *http.Request) {
	p, ps, _, ok := s.allowed(w, r, scheduleRights.mayAdmin, "delete the variables of this pipeline schedule (its owner and maintainers may)")
	if !ok {
		return
	}
	key := r.PathValue("key")
	var gone store.PipelineVariable
	_, err := s.pipelines.UpdateSchedule(r.Context(), p.ID, ps.ID, func(ps *store.PipelineSchedule) error {
		for i, v := range ps.Variables {
			if v.Key == key {
				gone = v
				ps.Variables = append(ps.Variables[:i], ps.Variables[i+1:]...)
				return nil
			}
		}
		return errVariableNotFound
	})
	switch {
	case errors.Is(err, errVariableNotFound):
		httpapi.WriteError(w, http.StatusNotFound, "404 Pipeline Schedule Variable Not Found")
	case err != nil:
		s.apiError(w, "deleting a pipeline schedule's variable", err)
	default:
		httpapi.WriteJSON(w, http.StatusAccepted, scheduleVariableJSON(gone))
	}
}
